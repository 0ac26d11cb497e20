"""The parts of tracing that need the OpenTelemetry SDK (the `server` extra): imported when a
`Traces` is built, never by importing mythic."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

__all__ = [
    "BatchSpanProcessor",
    "OTLPSpanExporter",
    "RecentTurns",
    "SpanExporter",
    "TurnSpans",
    "batch",
    "otlp_exporter",
    "provider",
]

_QUEUE = 4096
"""Spans a batch exporter holds for export; beyond it (a collector down for long) new ones
are dropped rather than kept growing."""
_DELAY_MS = 1000
"""How often a batch exporter sends what it holds."""


def provider(service_name: str) -> TracerProvider:
    """A tracer provider of its own (not the process's global one: a process may hold several
    servers, in tests), shut down by its owner, not at exit."""
    resource = Resource.create({"service.name": service_name})
    return TracerProvider(resource=resource, shutdown_on_exit=False)


def otlp_exporter(url: str, headers: Mapping[str, str] | None, timeout_s: float) -> SpanExporter:
    """OTLP over HTTP with protobuf to `url` (the whole traces URL); headers None: the
    standard `OTEL_EXPORTER_OTLP_HEADERS`."""
    return OTLPSpanExporter(
        endpoint=url, headers=dict(headers) if headers else None, timeout=timeout_s
    )


def batch(exporter: SpanExporter) -> BatchSpanProcessor:
    """`exporter` behind a bounded queue and a thread of its own: a span's end only queues it."""
    return BatchSpanProcessor(exporter, max_queue_size=_QUEUE, schedule_delay_millis=_DELAY_MS)


@dataclass(slots=True)
class TurnSpans:
    """One turn's trace as it is kept: its ids and its ended spans."""

    trace_id: str
    turn_id: str
    npc_id: str
    session_id: str
    started: float
    spans: list[tuple[int, str, float]] = field(default_factory=list)
    """(start in ns, hop, duration in ms) of each ended span."""


class RecentTurns(SpanProcessor):
    """Keeps the last `keep` turns' traces in memory, from their spans as they end (on any
    thread: the engine's worker ends its spans)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._turns: OrderedDict[int, TurnSpans] = OrderedDict()
        self._lock = threading.Lock()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.parent is not None:
            return
        attributes = span.attributes or {}
        turn_id = attributes.get("turn_id")
        if not isinstance(turn_id, str):
            return
        trace_id = span.context.trace_id
        turn = TurnSpans(
            trace_id=f"{trace_id:032x}",
            turn_id=turn_id,
            npc_id=str(attributes.get("npc_id", "")),
            session_id=str(attributes.get("session_id", "")),
            started=(span.start_time or 0) / 1e9,
        )
        with self._lock:
            self._turns[trace_id] = turn
            while len(self._turns) > self.keep:
                self._turns.popitem(last=False)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or span.start_time is None or span.end_time is None:
            return
        with self._lock:
            turn = self._turns.get(context.trace_id)
            if turn is not None:
                ms = (span.end_time - span.start_time) / 1e6
                turn.spans.append((span.start_time, span.name, ms))

    def recent(self, limit: int) -> list[TurnSpans]:
        """The last `limit` turns (copies), newest first; each one's spans in start order."""
        with self._lock:
            turns = sorted(self._turns.values(), key=lambda t: t.started, reverse=True)
            return [
                TurnSpans(t.trace_id, t.turn_id, t.npc_id, t.session_id, t.started, sorted(t.spans))
                for t in turns[: max(0, limit)]
            ]

    def shutdown(self) -> None:
        """Nothing to release: what it keeps stays readable."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        del timeout_millis
        return True
