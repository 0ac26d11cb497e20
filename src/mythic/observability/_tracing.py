"""A trace per NPC turn (OpenTelemetry): its hops as spans, each carrying the turn's ids.

A turn's hops, in the order a spoken line meets them: `gateway` (the root: from the line's
arrival, or the end of the player's utterance, to the reply's final delta), `asr` (the final
transcript), `actor` (the NPC's actor playing the turn), `retrieval` (lore and scene for the
line), `engine` (each model request of the turn, from submission to its last token) and `tts`
(the reply spoken). Every span has the attributes `session_id`, `npc_id` and `turn_id`.

A server's `Traces` keeps the last turns' traces in memory (`recent`) and, when configured,
exports every span over OTLP from a thread of its own; what runs a turn reaches it through
`current()` and the module's functions, which cost a context-variable read and do nothing
when no server traces (`mythic chat`, the engine on its own). The OpenTelemetry SDK is needed
only to build a `Traces`: importing this module loads none of it.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mythic._errors import MissingExtraError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

Attribute = str | bool | int | float | None
"""A span attribute's value; None: left out."""

_OPEN_TURNS = 4096
"""Turns whose spans are open at once, at most: beyond it the oldest is ended (a turn whose
end never came: a line refused before it reached its NPC, say)."""

_TurnKey = tuple[str, str, str]
"""(session_id, npc_id, turn_id)."""


@dataclass(frozen=True, slots=True)
class TurnTrace:
    """One turn's trace, as the server keeps it for its dashboard."""

    trace_id: str
    """The OpenTelemetry trace id: 32 hex digits (what a trace viewer finds it by)."""
    turn_id: str
    npc_id: str
    session_id: str
    started: float
    """When the turn began (unix seconds)."""
    spans: list[tuple[str, float]]
    """Each ended hop: (its name, its duration in ms), in the order they started."""


class Hop:
    """One hop of a turn being timed (an OpenTelemetry span): attributes, events, an end."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def set(self, **attributes: Attribute) -> None:
        """Set attributes (None values are left out)."""
        for key, value in attributes.items():
            if value is not None:
                self._span.set_attribute(key, value)

    def event(self, name: str, **attributes: Attribute) -> None:
        """Mark a moment of the hop (`first_audio`)."""
        self._span.add_event(name, _attributes(attributes))

    def end(self, *, error: str | None = None, at: float | None = None) -> None:
        """End the hop (again: nothing); `error`: it failed, and why; `at`: when, on the
        `time.perf_counter` clock (default: now)."""
        if not self._span.is_recording():
            return
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end(end_time=None if at is None else _wall_ns(at))

    @property
    def trace_id(self) -> str:
        """The trace's id, 32 hex digits."""
        return f"{self._span.get_span_context().trace_id:032x}"


@dataclass(slots=True)
class _Turn:
    """A turn whose spans are open: its root (`gateway`) and its actor's."""

    ids: dict[str, str]
    root: Hop | None = None
    actor: Hop | None = None
    root_done: bool = False
    actor_done: bool = False


_playing: ContextVar[_Turn | None] = ContextVar("mythic_turn_playing", default=None)
"""The turn the code running here belongs to (set while an actor plays it)."""
_current: Traces | None = None


class Traces:
    """The turns' traces of one server: the last `keep` kept in memory (`recent`), every span
    exported to the OTLP/HTTP collector at `url` when given, and to `export`'s exporters.

    Export runs in a batch processor's thread: a span's end only queues it, and when the
    collector is slow or down its queue (bounded) drops what it cannot hold. Nothing a turn
    awaits ever waits on it.

    Raises:
        MissingExtraError: the OpenTelemetry SDK (the `server` extra) is not installed.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        service_name: str = "mythic",
        keep: int = 200,
    ) -> None:
        try:
            from mythic.observability import _otel
        except ImportError as exc:
            raise MissingExtraError("opentelemetry-sdk", "server") from exc
        self._otel = _otel
        self.url = url
        """Where the spans are exported over OTLP; None: nowhere but `export`'s exporters."""
        self.provider: TracerProvider = _otel.provider(service_name)
        self._recent = _otel.RecentTurns(keep)
        self.provider.add_span_processor(self._recent)
        if url is not None:
            self.export(_otel.otlp_exporter(url, headers, timeout_s))
        self._tracer: Tracer = self.provider.get_tracer("mythic")
        self._turns: OrderedDict[_TurnKey, _Turn] = OrderedDict()

    def export(self, exporter: SpanExporter) -> None:
        """Send every span from now on to `exporter` too, in batches from a thread of its own
        (a test's in-memory exporter, a second collector)."""
        self.provider.add_span_processor(self._otel.batch(exporter))

    def recent(self, limit: int) -> list[TurnTrace]:
        """The last `limit` turns' traces, newest first (with the spans ended so far)."""
        return [
            TurnTrace(
                trace_id=t.trace_id,
                turn_id=t.turn_id,
                npc_id=t.npc_id,
                session_id=t.session_id,
                started=t.started,
                spans=[(name, ms) for _, name, ms in t.spans],
            )
            for t in self._recent.recent(limit)
        ]

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Export what is queued now (blocking: from a worker thread); whether all of it went
        within `timeout_s`."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        """Export what is queued and stop the exporters' threads (blocking, at most about the
        export timeout: from a worker thread). The turns kept stay readable."""
        for turn in list(self._turns.values()):
            _end_open(turn, "the server stopped")
        self._turns.clear()
        self.provider.shutdown()

    @contextlib.contextmanager
    def serving(self) -> Iterator[Traces]:
        """Make these the traces `current()` gives while the block runs (a running server's);
        the ones before come back after."""
        global _current
        before, _current = _current, self
        try:
            yield self
        finally:
            _current = before

    # -- a turn's spans -----------------------------------------------------------------------

    def begin(
        self,
        session_id: str,
        npc_id: str,
        turn_id: str,
        *,
        start: float | None = None,
        **attributes: Attribute,
    ) -> Hop:
        """A turn's line has reached the server: its trace starts with the `gateway` hop,
        which `end` ends (at the reply's final delta). `start`: when it began, on the
        `time.perf_counter` clock (a spoken line: when the player stopped speaking)."""
        key = (session_id, npc_id, turn_id)
        old = self._turns.get(key)
        if old is not None and old.root is None and old.actor is not None:
            # A preemptive spoken reply is already playing this turn (it began at the
            # player's pause): its trace stays rooted at its `actor` hop.
            return old.actor
        old = self._turns.pop(key, None)
        if old is not None:  # the client reused a turn id: the old turn is over
            _end_open(old, "its turn id was used again")
        turn = _Turn({"session_id": session_id, "npc_id": npc_id, "turn_id": turn_id})
        turn.root = self._start("gateway", None, turn.ids, attributes, start)
        self._keep(key, turn)
        return turn.root

    def end(
        self,
        session_id: str,
        npc_id: str,
        turn_id: str,
        *,
        error: str | None = None,
        **attributes: Attribute,
    ) -> None:
        """The turn's reply is over (its final delta went out): its `gateway` hop ends.
        Nothing when the turn has no open trace."""
        key = (session_id, npc_id, turn_id)
        turn = self._turns.get(key)
        if turn is None or turn.root is None or turn.root_done:
            return
        turn.root.set(**attributes)
        turn.root.end(error=error)
        turn.root_done = True
        if turn.actor is None or turn.actor_done:
            del self._turns[key]

    @contextlib.contextmanager
    def playing(
        self, session_id: str, npc_id: str, turn_id: str, **attributes: Attribute
    ) -> Iterator[Hop]:
        """The `actor` hop: the block plays the turn, and the hops started in it (`hop`) are
        the actor's children. Under the turn's `gateway` hop when it began one, else the
        root of a trace of its own (a scene's line, an NPC talking ambiently)."""
        key = (session_id, npc_id, turn_id)
        turn = self._turns.get(key)
        if turn is None:
            turn = _Turn({"session_id": session_id, "npc_id": npc_id, "turn_id": turn_id})
            turn.root_done = True
            self._keep(key, turn)
        actor = self._start("actor", turn.root, turn.ids, attributes, None)
        turn.actor = actor
        token = _playing.set(turn)
        error: str | None = None
        try:
            yield actor
        except BaseException as exc:
            error = _why(exc)
            raise
        finally:
            _playing.reset(token)
            actor.end(error=error)
            turn.actor_done = True
            if turn.root_done and self._turns.get(key) is turn:
                del self._turns[key]

    def hop(self, name: str, **attributes: Attribute) -> Hop | None:
        """Start the hop `name` of the turn played here (a child of its `actor`); None when
        no turn is being played in this context. The caller ends it."""
        turn = _playing.get()
        if turn is None or turn.actor is None:
            return None
        return self._start(name, turn.actor, turn.ids, attributes, None)

    def hop_of(
        self,
        name: str,
        session_id: str,
        npc_id: str,
        turn_id: str,
        *,
        start: float | None = None,
        **attributes: Attribute,
    ) -> Hop | None:
        """Start the hop `name` of the turn `turn_id` (a child of its actor, else of its
        `gateway` hop), from wherever it runs; None when that turn has no open trace.
        `start`: on the `time.perf_counter` clock (default: now). The caller ends it."""
        turn = self._turns.get((session_id, npc_id, turn_id))
        if turn is None:
            return None
        parent = turn.actor if turn.actor is not None else turn.root
        if parent is None:
            return None
        return self._start(name, parent, turn.ids, attributes, start)

    def _start(
        self,
        name: str,
        parent: Hop | None,
        ids: dict[str, str],
        attributes: Mapping[str, Attribute],
        start: float | None,
    ) -> Hop:
        from opentelemetry.trace import set_span_in_context

        context = set_span_in_context(parent._span) if parent is not None else None
        span = self._tracer.start_span(
            name,
            context=context,
            attributes={**ids, **_attributes(attributes)},
            start_time=None if start is None else _wall_ns(start),
        )
        return Hop(span)

    def _keep(self, key: _TurnKey, turn: _Turn) -> None:
        self._turns[key] = turn
        while len(self._turns) > _OPEN_TURNS:
            _, oldest = self._turns.popitem(last=False)
            _end_open(oldest, "abandoned: its end never came")


def _end_open(turn: _Turn, why: str) -> None:
    if turn.actor is not None and not turn.actor_done:
        turn.actor.end(error=why)
        turn.actor_done = True
    if turn.root is not None and not turn.root_done:
        turn.root.end(error=why)
        turn.root_done = True


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _attributes(attributes: Mapping[str, Attribute]) -> dict[str, str | bool | int | float]:
    return {k: v for k, v in attributes.items() if v is not None}


def _wall_ns(at: float) -> int:
    """A `time.perf_counter` reading as OpenTelemetry's clock (unix nanoseconds)."""
    return time.time_ns() - int((time.perf_counter() - at) * 1e9)


# -- for the code that runs a turn ------------------------------------------------------------


def current() -> Traces | None:
    """The running server's traces (`Traces.serving`); None when nothing traces."""
    return _current


def hop(name: str, **attributes: Attribute) -> Hop | None:
    """`Traces.hop` on the current traces: the hop `name` of the turn played here, or None
    (no server tracing, or no turn here: a prefill, an intent, a warm-up)."""
    traces = _current
    if traces is None or _playing.get() is None:
        return None
    return traces.hop(name, **attributes)


@contextlib.contextmanager
def traced(name: str, **attributes: Attribute) -> Iterator[Hop | None]:
    """The block as the hop `name` of the turn played here (`hop`), ended when it exits,
    failed when it raises; the block gets None and runs untraced outside a traced turn."""
    started = hop(name, **attributes)
    if started is None:
        yield None
        return
    try:
        yield started
    except BaseException as exc:
        started.end(error=_why(exc))
        raise
    started.end()


def hop_of(
    name: str,
    session_id: str,
    npc_id: str,
    turn_id: str,
    *,
    start: float | None = None,
    **attributes: Attribute,
) -> Hop | None:
    """`Traces.hop_of` on the current traces, or None."""
    traces = _current
    if traces is None:
        return None
    return traces.hop_of(name, session_id, npc_id, turn_id, start=start, **attributes)


@contextlib.contextmanager
def playing(
    session_id: str, npc_id: str, turn_id: str, **attributes: Attribute
) -> Iterator[Hop | None]:
    """`Traces.playing` on the current traces (the block runs untraced without them)."""
    traces = _current
    if traces is None:
        yield None
        return
    with traces.playing(session_id, npc_id, turn_id, **attributes) as actor:
        yield actor
