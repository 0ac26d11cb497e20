"""The shared engine: many NPCs' requests, one model, continuous batching.

`submit` validates a request on the caller's thread (tokenize, grammar, adapters: errors come
back before anything is queued; `_input`) and hands it to the scheduler. One worker thread runs
the loop: schedule a step, evaluate each adapter group in one backend call, sample every
sequence that is due a token, fold the outcome back and hand deltas to the waiting streams
(`_output`). The event loop never waits on the model: backend calls release the GIL and run on
the worker.

LoRA adapters are loaded and unloaded while the engine runs (`load_adapter`, `unload_adapter`
and their async forms): the worker does it between two steps, so no decode ever sees an adapter
change under it. Unloading an adapter that queued or running requests use is refused with
`AdapterInUseError` (nothing is deferred: the caller tries again, or unloads another one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from os import PathLike
from typing import Literal

from mythic.config import EngineSettings
from mythic.engine._backend import (
    Backend,
    BackendError,
    DecodeInterrupted,
    KVCacheFullError,
    SequenceChunk,
)
from mythic.engine._config import EngineConfig
from mythic.engine._errors import (
    AdapterError,
    AdapterInUseError,
    DeadlineExceeded,
    EngineClosedError,
    EngineError,
    InvalidRequestError,
    Overloaded,
    UnknownAdapterError,
)
from mythic.engine._input import ActiveRequest, InputProcessor, Sink, adapter_key
from mythic.engine._kvcache import SequenceCache, common_prefix
from mythic.engine._output import fold_token, next_delta, ready_text
from mythic.engine._request import (
    FinishReason,
    GenerationRequest,
    RequestStream,
    SyncRequestStream,
)
from mythic.engine._scheduler import (
    Priority,
    ScheduledEntry,
    Scheduler,
    SchedulerOutput,
)
from mythic.engine._trace import EngineTrace
from mythic.observability import Hop, hop, percentile

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
"""How often the worker wakes while requests wait, to expire deadlines on time."""
_SAMPLES = 2048
"""Recent requests kept for latency percentiles."""


@dataclass(slots=True)
class _AdapterCommand:
    """A load or unload the worker runs between two steps; `done` carries the outcome."""

    action: Literal["load", "unload"]
    name: str
    path: str
    done: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)


@dataclass(slots=True, frozen=True)
class EngineMetrics:
    """A snapshot of the engine's counters and recent latencies."""

    submitted: int
    completed: int
    cancelled: int
    failed: int
    expired: int
    overloaded: int
    waiting: int
    running: int
    steps: int
    decode_calls: int
    generated_tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int
    prefix_lookups: int
    prefix_hits: int
    prefix_joins: int
    """Requests that copied the start of their prompt from a request running beside them
    (arrived together, the same start) instead of evaluating it too."""
    sessions_parked: int
    """Evicted sessions whose KV was kept in host memory (`engine.park_mb`)."""
    sessions_restored: int
    """Sessions whose parked KV was loaded back for their next turn."""
    parked_bytes: int
    adapter_switches: int
    adapter_loads: int
    """Adapters loaded while running (`load_adapter`), not counting those loaded at start."""
    adapter_unloads: int
    adapter_requests: dict[str, int]
    """Requests submitted with each adapter, by adapter name."""
    preemptions: int
    """Decode calls stopped part-way so that a gold request could start at once."""
    cancel_stops: int
    """Decode calls stopped part-way because every request in them was cancelled."""
    kv_cells_reserved: int
    kv_cells_idle: int
    kv_capacity: int
    busy_s: float
    batch_sizes: dict[int, int]
    """Sequences per decode call (power-of-two buckets) -> number of calls."""
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None
    first_token_p50_s: float | None
    first_token_p95_s: float | None

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of model time."""
        return self.generated_tokens / self.busy_s if self.busy_s else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_lookups if self.prefix_lookups else 0.0


class Engine:
    """One model shared by many NPCs. Thread-safe; `submit` needs a running event loop."""

    def __init__(self, backend: Backend, config: EngineConfig | None = None) -> None:
        self.backend = backend
        self.config = config or EngineConfig.for_backend(backend)
        self._input = InputProcessor(backend, self.config)
        self._lock = threading.Condition()
        self._scheduler = Scheduler(self.config.scheduler, on_admit=self._on_admit)
        self._cache = SequenceCache(
            backend,
            backend.n_seq_max,
            self.config.prefix_min_tokens,
            shift_min_tokens=self.config.shift_min_tokens,
            park_bytes=self.config.park_bytes,
        )
        self._active: dict[str, ActiveRequest] = {}
        self._cancelled: list[ActiveRequest] = []
        self._decoding: frozenset[str] = frozenset()
        """The requests of the decode call running now (set by the worker, under the lock)."""
        self._cancel_stop = False
        """`cancel` interrupted the decode call running now (under the lock)."""
        self._gold_stop = False
        """A gold request interrupted the step running now (under the lock)."""
        self._closing = False
        self._dead: BaseException | None = None
        self._counts: Counter[str] = Counter()
        self._batch_sizes: Counter[int] = Counter()
        self._busy_s = 0.0
        self._queue_waits: deque[float] = deque(maxlen=_SAMPLES)
        self._first_tokens: deque[float] = deque(maxlen=_SAMPLES)
        self._loaded: set[str] = set(backend.adapters)
        """Adapters requests may name; changed only by the worker, under the lock."""
        self._adapter_users: Counter[str] = Counter()
        """Adapter -> requests queued or running with it (under the lock)."""
        self._adapter_requests: Counter[str] = Counter()
        self._commands: deque[_AdapterCommand] = deque()
        self._stopped = False
        """The worker has stopped: no command would ever run."""
        self.trace: EngineTrace | None = None
        """What each step evaluated for whom (`engine.trace_steps`, `start_trace`), or None."""
        if self.config.trace_steps:
            self.start_trace(self.config.trace_steps)
        self._thread = threading.Thread(target=self._run, name="mythic-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, settings: EngineSettings, model: str | None = None) -> Engine:
        """Load `model` (default: the dialogue model) and its adapters, and start the engine.

        Raises:
            ModelError: the model cannot be resolved or loaded.
            AdapterError: a configured adapter cannot be loaded.
            MissingExtraError: llama-cpp-python (or, for `engine.backend: transformers`, torch,
                transformers and peft) is not installed.
        """
        backend: Backend
        if settings.backend == "transformers":
            from mythic.engine._transformers import load_transformers_backend

            backend = load_transformers_backend(model or settings.dialogue_model, settings)
        else:
            from mythic.engine._llamacpp import load_backend

            backend = load_backend(model or settings.dialogue_model, settings)
        try:
            for name, path in settings.adapters.items():
                backend.load_adapter(name, str(path))
        except BaseException:
            backend.close()
            raise
        return cls(backend, EngineConfig.for_backend(backend, settings))

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue a request; iterate the returned stream for its deltas.

        Raises:
            InvalidRequestError: malformed request; subclasses name the cause
                (`ContextOverflowError`, `GrammarError`, `UnknownAdapterError`).
            Overloaded: the queue is full; retry later or use a fallback.
            EngineClosedError: the engine is closed.
        """
        stream = RequestStream(request.request_id, self.cancel)
        self._enqueue(request, stream)
        return stream

    def submit_sync(self, request: GenerationRequest) -> SyncRequestStream:
        """`submit` for a caller without an event loop; the stream is a plain iterator."""
        stream = SyncRequestStream(request.request_id, self.cancel)
        self._enqueue(request, stream)
        return stream

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The tokens the engine would evaluate for `request`'s prompt (its messages rendered
        with the model's chat template, or its raw prompt), before any cache reuse; for
        benchmarks that send the very same tokens to another server.

        Raises:
            InvalidRequestError: the request has no prompt or messages the model can take.
        """
        return self._input.tokens(request)

    def start_trace(self, max_steps: int) -> EngineTrace:
        """Trace the steps from now on (the last `max_steps` of them, and the requests
        submitted meanwhile), replacing any trace running: `EngineTrace`."""
        sched = self.config.scheduler
        step_cap = min(sched.max_batch_tokens, sched.max_seq_chunk or sched.max_batch_tokens)
        self.trace = EngineTrace(max_steps, step_cap=step_cap)
        return self.trace

    def stop_trace(self) -> EngineTrace | None:
        """Stop tracing; the trace that ran, if any."""
        trace, self.trace = self.trace, None
        return trace

    def cancel(self, request_id: str) -> bool:
        """Cancel a request (barge-in): its stream ends with finish_reason `cancelled` and its
        sequence is freed within one step. False if it is unknown or already finished."""
        with self._lock:
            active = self._active.get(request_id)
            if active is None or active.done:
                return False
            active.done = True
            self._scheduler.remove(request_id)
            self._cancelled.append(active)
            running = self._decoding
            if (
                running
                and all((other := self._active.get(rid)) is None or other.done for rid in running)
                # A warm-up's step, cancelled now or before, is let finish (its KV is kept).
                and not any(
                    (other := self._active.get(rid)) is not None
                    and other.request.finish_step_on_cancel
                    for rid in running
                )
            ):
                # Nobody wants what the running decode call computes: stop it now (its
                # cells are rolled back; the cancelled request keeps what came before).
                # Withdrawn when that call returns first (`_evaluate`): the step's next call
                # is not this cancel's to stop.
                self._cancel_stop = True
                self.backend.interrupt()
            self._lock.notify()
            return True

    def _enqueue(self, request: GenerationRequest, sink: Sink) -> None:
        if self._closing or self._dead is not None:
            raise EngineClosedError("the engine is closed")
        active = self._input.prepare(request, sink, self._loaded)
        entry = ScheduledEntry(
            request_id=request.request_id,
            priority=request.priority,
            arrival=active.submitted,
            prompt_tokens=len(active.prompt),
            max_tokens=active.max_tokens,
            kv_cells=len(active.prompt) + active.max_tokens,
            adapter_key=active.adapter_key,
            step_tokens=request.step_tokens,
            deadline=(
                active.submitted + request.deadline_s if request.deadline_s is not None else None
            ),
        )
        with self._lock:
            if request.request_id in self._active:
                self.backend.free_sampler(active.sampler)
                raise InvalidRequestError(f"request id {request.request_id!r} is in use")
            try:
                # Checked again under the lock: an unload may have run since `_prepare`.
                adapter_key(request.adapters, self._loaded)
            except UnknownAdapterError:
                self.backend.free_sampler(active.sampler)
                raise
            try:
                self._scheduler.add(entry)
            except Overloaded:
                self._counts["overloaded"] += 1
                self.backend.free_sampler(active.sampler)
                raise
            # Started under the lock: the worker cannot finish the request before it has one.
            active.hop = hop(
                "engine",
                priority=request.priority.name.lower(),
                prompt_tokens=len(active.prompt),
                max_tokens=active.max_tokens,
            )
            self._active[request.request_id] = active
            if self.trace is not None:
                self.trace.arrived(
                    request.request_id, request.npc_id, request.session_id, request.priority
                )
            for name, _ in active.adapter_key:
                self._adapter_users[name] += 1
                self._adapter_requests[name] += 1
            self._counts["submitted"] += 1
            if request.priority is Priority.GOLD and self.config.gold_preempts:
                # Gold does not wait for a step already running: that step is stopped and
                # redone after gold's (cleared at the next schedule, which includes gold).
                self._gold_stop = True
                self.backend.interrupt()
            self._lock.notify()

    # -- the worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (
                        self._closing
                        or self._cancelled
                        or self._commands
                        or self._scheduler.has_work
                    ):
                        self._lock.wait()
                    if self._closing:
                        break
                try:
                    self._run_commands()
                    self._step()
                except Exception as exc:  # a bug must not wedge the engine: fail and go on
                    logger.exception("unexpected error in the engine's step; recovering")
                    self._recover(exc)
        except BaseException as exc:  # the worker must never die silently
            logger.exception("the engine's worker failed; the engine is closed")
            self._dead = exc
        finally:
            self._shutdown()

    def _step(self) -> None:
        now = time.monotonic()
        trace: EngineTrace | None = None
        step_index, priorities = 0, dict[str, Priority]()
        # Cancelled requests give their sequences back before any request is admitted: a
        # line that replaces a cancelled one (a barge-in, a warm-up stopped for the line)
        # then finds its session's KV free, not busy (it would start from a shared prefix).
        # Finished outside the lock (their streams are told), until none is left when the
        # lock is taken to schedule.
        while True:
            with self._lock:
                cancelled, self._cancelled = self._cancelled, []
                if not cancelled:
                    self.backend.clear_interrupt()
                    self._gold_stop = self._cancel_stop = False
                    for active in [a for a in self._active.values() if a.leader is not None]:
                        self._join(active)
                    out = self._scheduler.schedule(now)
                    expired = [self._active[rid] for rid in out.expired]
                    trace = self.trace
                    if trace is not None and out.num_tokens:
                        step_index = trace.begin()
                        priorities = {
                            c.request_id: self._active[c.request_id].request.priority
                            for c in out.chunks()
                        }
                    break
            for active in cancelled:
                self._finish(active, "cancelled", keep=len(active.prompt) - len(active.to_eval))
        for active in expired:
            self._fail(
                active,
                DeadlineExceeded(
                    f"request {active.request.request_id} for {active.request.npc_id} cannot "
                    "finish before its deadline",
                    fix="use the fallback line; raise deadline_s or lower the load",
                ),
            )
        if out.num_tokens == 0:
            with self._lock:
                idle = not (self._cancelled or self._commands or self._closing)
                if self._scheduler.has_work and idle:
                    self._lock.wait(_IDLE_WAIT_S)
            return
        started = time.monotonic()
        finished: list[str] = []
        try:
            done = self._evaluate(out, finished)
        except BackendError as exc:
            logger.warning("backend failure; failing in-flight requests and resetting: %s", exc)
            self._recover(exc)
            return
        step_s = time.monotonic() - started
        self._busy_s += step_s
        self._counts["steps"] += 1
        if done < len(out.batches):
            # Preempted by a gold request: the batches not run are scheduled again, and the
            # step's time says nothing about the model's speed.
            out = SchedulerOutput(out.batches[:done], out.admitted, out.expired)
            step_s = 0.0
        if trace is not None and out.num_tokens:
            trace.ran(step_index, out, priorities)
        with self._lock:
            self._scheduler.update(out, finished, step_s)

    def _evaluate(self, out: SchedulerOutput, finished: list[str]) -> int:
        """Run the step's batches; returns how many ran (fewer when gold preempted the step)."""
        for done, batch in enumerate(out.batches):
            items: list[tuple[ActiveRequest, list[int], bool]] = []
            chunks: list[SequenceChunk] = []
            for chunk in batch.chunks:
                active = self._active.get(chunk.request_id)
                if active is None or active.done or active.seq is None:
                    continue
                seq = active.seq
                if active.scheduled_at is None:
                    active.scheduled_at = time.monotonic()
                    self._queue_waits.append(active.scheduled_at - active.submitted)
                if chunk.prefill:
                    tokens = active.to_eval[: chunk.n_tokens]
                    del active.to_eval[: chunk.n_tokens]
                else:
                    assert active.last_token is not None
                    tokens = [active.last_token]
                chunks.append(
                    SequenceChunk(
                        seq.seq_id, tokens, len(seq.tokens), chunk.sample, chunk.adapter_key
                    )
                )
                seq.tokens += tokens
                items.append((active, tokens if chunk.prefill else [], chunk.sample))
            if not chunks:
                continue
            if batch.adapter_key is not None and self.backend.set_adapters(batch.adapter_key):
                self._counts["adapter_switches"] += 1
            with self._lock:
                self._decoding = frozenset(active.request.request_id for active, _, _ in items)
            try:
                outputs = self._decode(chunks, interruptible=not batch.gold)
            except DecodeInterrupted:
                wanted = any(not active.done for active, _, _ in items)
                self._counts["preemptions" if wanted else "cancel_stops"] += 1
                for (active, prefill, _), evaluated in zip(items, chunks, strict=True):
                    assert active.seq is not None
                    del active.seq.tokens[evaluated.pos :]
                    active.to_eval[:0] = prefill
                return done
            finally:
                with self._lock:
                    self._decoding = frozenset()
                    if self._cancel_stop and not self._gold_stop:
                        # A cancel that came too late (or for a gold call, which is not
                        # interruptible) must not stop the step's next call.
                        self.backend.clear_interrupt()
                    self._cancel_stop = False
            self._counts["decode_calls"] += 1
            self._batch_sizes[1 << (len(chunks) - 1).bit_length()] += 1
            for (active, _, sample), index in zip(items, outputs, strict=True):
                if sample:
                    token = self.backend.sample(active.sampler, index)
                    if self._accept(active, token):
                        finished.append(active.request.request_id)
        return len(out.batches)

    def _decode(self, chunks: list[SequenceChunk], *, interruptible: bool) -> list[int]:
        try:
            return self.backend.decode(chunks, interruptible=interruptible)
        except KVCacheFullError:
            # Idle sessions and prefixes are only a cache: drop them all and try once more.
            self._cache.evict(0)
            return self.backend.decode(chunks, interruptible=interruptible)

    def _accept(self, active: ActiveRequest, token: int) -> bool:
        """Fold a sampled token into its request; True when the request is finished."""
        now = time.monotonic()
        if active.first_token_at is None:
            active.first_token_at = now
            self._first_tokens.append(now - active.submitted)
            self._counts["prompt_tokens"] += len(active.prompt)
            self._counts["cached_prompt_tokens"] += active.cached
            assert active.seq is not None
            if active.prefix_len and active.cached < active.prefix_len:
                self._cache.share_prefix(active.seq, active.prefix_len)
        if active.done:
            return False
        generated = active.generated
        reason = fold_token(active, token, self.backend)
        self._counts["generated_tokens"] += active.generated - generated
        if reason is not None:
            self._finish(active, reason)
            return True
        text = ready_text(active)
        if text:
            self._emit(active, text, None)
        return False

    def _emit(self, active: ActiveRequest, text: str, reason: FinishReason | None) -> None:
        delivered = active.sink._put(next_delta(active, text, reason))
        if not delivered and reason is None:
            # The caller went away without cancelling (its event loop closed): stop now.
            with self._lock:
                if not active.done:
                    active.done = True
                    self._scheduler.remove(active.request.request_id)
                    self._cancelled.append(active)

    # The request is closed (sequence released, scheduler entry removed) before its caller
    # hears the end, so whoever reads the final delta sees the engine without it.

    def _finish(
        self, active: ActiveRequest, reason: FinishReason, *, keep: int | None = None
    ) -> None:
        self._counts["cancelled" if reason == "cancelled" else "completed"] += 1
        if logger.isEnabledFor(logging.DEBUG):
            now, req = time.monotonic(), active.request
            logger.debug(
                "%s %s/%s %s: prompt %d tokens (%d cached), queued %.0f ms, first token %s, "
                "%d tokens in %.0f ms",
                req.request_id[:8],
                req.npc_id,
                req.session_id,
                reason,
                len(active.prompt),
                active.cached,
                ((active.scheduled_at or now) - active.submitted) * 1000,
                f"{(active.first_token_at - active.submitted) * 1000:.0f} ms"
                if active.first_token_at
                else "none",
                active.generated,
                (now - active.submitted) * 1000,
            )
        self._close_request(active, keep=keep)
        if active.hop is not None:
            self._end_hop(active.hop, active, reason)
        self._emit(active, active.text[active.sent :], reason)

    def _fail(self, active: ActiveRequest, error: BaseException) -> None:
        self._counts["expired" if isinstance(error, DeadlineExceeded) else "failed"] += 1
        self._close_request(active, keep=None, discard=not isinstance(error, DeadlineExceeded))
        if active.hop is not None:
            self._end_hop(active.hop, active, None, error)
        active.sink._put(error)

    @staticmethod
    def _end_hop(
        span: Hop,
        active: ActiveRequest,
        reason: FinishReason | None,
        error: BaseException | None = None,
    ) -> None:
        """End a request's `engine` hop with what it did (queue wait and first token in ms
        after submission)."""
        ms = 1000.0
        span.set(
            finish_reason=reason,
            completion_tokens=active.generated,
            cached_tokens=active.cached,
            queue_ms=(active.scheduled_at - active.submitted) * ms if active.scheduled_at else None,
            first_token_ms=(
                (active.first_token_at - active.submitted) * ms if active.first_token_at else None
            ),
        )
        span.end(error=None if error is None else f"{type(error).__name__}: {error}")

    def _close_request(
        self, active: ActiveRequest, *, keep: int | None, discard: bool = False
    ) -> None:
        active.done = True
        if active.leader is not None:
            active.leader.followers.remove(active)
            active.leader = None
        if active.followers:
            if discard and active.seq is not None:
                active.seq.tokens.clear()  # not to be copied: its cells cannot be trusted
            with self._lock:
                for follower in list(active.followers):
                    self._join(follower)
        with self._lock:
            if self._active.pop(active.request.request_id, None) is not None:
                self._release_adapters(active)
            self._scheduler.remove(active.request.request_id)
        self.backend.free_sampler(active.sampler)
        if active.seq is not None:
            if discard or not active.request.keep_session:
                self._cache.discard(active.seq)
            else:
                self._cache.release(active.seq, keep=keep)
            active.seq = None

    def _on_admit(self, entry: ScheduledEntry) -> None:
        """Called by the scheduler (under the lock, on the worker) as a request starts."""
        active = self._active[entry.request_id]
        session = (active.request.npc_id, active.request.session_id)
        got = self._cache.acquire(session, active.adapter_key, active.prompt)
        active.seq = got.seq
        active.cached = got.cached
        active.to_eval = active.prompt[got.cached :]
        entry.prompt_tokens = len(active.to_eval)
        self._counts["prefix_lookups"] += 1
        if got.cached:
            self._counts["prefix_hits"] += 1
        if got.source != "session":
            self._follow(active, entry)
        room = self.config.scheduler.kv_capacity - self._scheduler.kv_reserved
        self._cache.evict(room)

    def _follow(self, active: ActiveRequest, entry: ScheduledEntry) -> None:
        """A request that starts a sequence: when a request running beside it has a prompt
        that starts the same way for at least `prefix_min_tokens` more than it has cached
        (NPCs of one world and zone, two players' sessions with one NPC, arriving together),
        it copies those cells from that one rather than evaluate them a second time: now if
        they are evaluated, else once they are (its entry is held until then: `_join`)."""
        limit = len(active.prompt) - 1
        best: ActiveRequest | None = None
        best_len = active.cached + self.config.prefix_min_tokens - 1
        for other in self._active.values():
            if (
                other is active
                or other.seq is None
                or other.done
                or other.leader is not None
                or other.adapter_key != active.adapter_key
                # Never wait on a request that may be served after this one.
                or other.request.priority > active.request.priority
            ):
                continue
            n = min(common_prefix(other.prompt, active.prompt), limit)
            if n > best_len:
                best, best_len = other, n
        if best is None:
            return
        active.leader, active.lead = best, best_len
        best.followers.append(active)
        entry.held = True
        self._join(active)

    def _join(self, active: ActiveRequest) -> None:
        """Copy a held request's shared cells from its leader once the leader has evaluated
        them, and let it run; let it run without them when the leader ended first."""
        leader = active.leader
        assert leader is not None
        assert active.seq is not None
        ready = leader.seq is not None and len(leader.seq.tokens) >= active.lead
        if not ready and leader.seq is not None and not leader.done:
            return  # still evaluating them
        if ready:
            assert leader.seq is not None
            self._cache.adopt(active.seq, leader.seq, active.lead)
            active.cached = active.lead
            active.to_eval = active.prompt[active.lead :]
            self._counts["prefix_joins"] += 1
        active.leader = None
        leader.followers.remove(active)
        entry = self._scheduler.get(active.request.request_id)
        if entry is not None:
            entry.prompt_tokens = len(active.to_eval)
            entry.held = False

    def _recover(self, exc: BaseException) -> None:
        """Fail what was in flight, reset the backend's memory, and carry on."""
        with self._lock:
            running = [a for a in self._active.values() if a.seq is not None]
        for active in running:
            self._fail(active, EngineError(f"the model backend failed: {exc}"))
        self.backend.clear()
        self._cache.reset()

    def _shutdown(self) -> None:
        with self._lock:
            self._stopped = True
            leftovers = list(self._active.values())
            self._active.clear()
            self._adapter_users.clear()
            commands, self._commands = self._commands, deque()
        error = EngineClosedError("the engine was closed before the request finished")
        for active in leftovers:
            if active.hop is not None:
                self._end_hop(active.hop, active, None, error)
            active.sink._put(error)
            self.backend.free_sampler(active.sampler)
        for command in commands:
            if command.done.set_running_or_notify_cancel():
                command.done.set_exception(
                    EngineClosedError(f"the engine was closed before {command.name!r} was loaded")
                    if command.action == "load"
                    else EngineClosedError("the engine was closed")
                )

    # -- adapters ------------------------------------------------------------------------------

    @property
    def adapters(self) -> frozenset[str]:
        """Names of the loaded adapters, which requests may name."""
        with self._lock:
            return frozenset(self._loaded)

    def adapters_in_use(self) -> frozenset[str]:
        """Adapters that queued or running requests use: `unload_adapter` refuses these."""
        with self._lock:
            return frozenset(self._adapter_users)

    def load_adapter(self, name: str, path: str | PathLike[str]) -> None:
        """Load a LoRA adapter under `name` while the engine runs; returns once requests may
        name it. The worker loads it between two steps (the other NPCs' streams pause for the
        load). Blocks: on an event loop, await `aload_adapter` instead.

        Raises:
            AdapterError: the name is taken, or the file is missing or not an adapter for this
                model.
            EngineClosedError: the engine is closed.
        """
        self._adapter_command("load", name, path).result()

    async def aload_adapter(self, name: str, path: str | PathLike[str]) -> None:
        """`load_adapter` for an event loop: the loop keeps running while the worker loads."""
        await asyncio.wrap_future(self._adapter_command("load", name, path))

    def unload_adapter(self, name: str) -> None:
        """Unload an adapter and free its memory, between two steps; its idle cached KV goes
        with it. Blocks: on an event loop, await `aunload_adapter` instead.

        Raises:
            AdapterInUseError: queued or running requests use it (retry once they finish).
            AdapterError: no adapter of that name is loaded, or the backend cannot unload.
            EngineClosedError: the engine is closed.
        """
        self._adapter_command("unload", name).result()

    async def aunload_adapter(self, name: str) -> None:
        """`unload_adapter` for an event loop."""
        await asyncio.wrap_future(self._adapter_command("unload", name))

    def _adapter_command(
        self, action: Literal["load", "unload"], name: str, path: str | PathLike[str] = ""
    ) -> concurrent.futures.Future[None]:
        if not isinstance(name, str) or not name:
            raise AdapterError(f"an adapter needs a non-empty name, not {name!r}")
        if threading.current_thread() is self._thread:
            raise RuntimeError("the engine's own worker cannot wait for an adapter command")
        command = _AdapterCommand(action, name, str(path))
        with self._lock:
            if self._closing or self._stopped or self._dead is not None:
                raise EngineClosedError("the engine is closed")
            self._commands.append(command)
            self._lock.notify()
        return command.done

    def _run_commands(self) -> None:
        """Run the queued loads and unloads (on the worker, between steps); each outcome goes
        to its caller."""
        while True:
            with self._lock:
                if not self._commands:
                    return
                command = self._commands.popleft()
            if not command.done.set_running_or_notify_cancel():
                continue  # the caller gave up before it ran
            try:
                if command.action == "load":
                    self._load_now(command.name, command.path)
                else:
                    self._unload_now(command.name)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, who raises it
                command.done.set_exception(exc)
            except BaseException:
                command.done.set_exception(EngineClosedError("the engine's worker failed"))
                raise
            else:
                command.done.set_result(None)

    def _load_now(self, name: str, path: str) -> None:
        if name in self._loaded:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        self.backend.load_adapter(name, path)
        with self._lock:
            self._loaded.add(name)
            self._counts["adapter_loads"] += 1

    def _unload_now(self, name: str) -> None:
        with self._lock:
            if name not in self._loaded:
                raise AdapterError(f"no adapter named {name!r} is loaded")
            users = self._adapter_users[name]
            if users:
                raise AdapterInUseError(
                    f"adapter {name!r} is used by {users} queued or running requests",
                    fix="unload it once they finish",
                )
            # From here on no request can name it; none holds it.
            self._loaded.discard(name)
        self._cache.forget_adapter(name)
        try:
            self.backend.unload_adapter(name)
        except BaseException:
            with self._lock:
                self._loaded.add(name)
            raise
        with self._lock:
            self._counts["adapter_unloads"] += 1

    def _release_adapters(self, active: ActiveRequest) -> None:
        """A request is over: it no longer holds its adapters (called under the lock)."""
        for name, _ in active.adapter_key:
            self._adapter_users[name] -= 1
            if self._adapter_users[name] <= 0:
                del self._adapter_users[name]

    # -- lifecycle and metrics -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the engine takes requests (not closed, its worker not dead)."""
        return not self._closing and self._dead is None and self._thread.is_alive()

    def close(self) -> None:
        """Stop the worker, fail unfinished requests with `EngineClosedError`, free the model."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._lock.notify()
        self._thread.join()
        self.backend.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def metrics(self) -> EngineMetrics:
        with self._lock:
            waits = sorted(self._queue_waits)
            firsts = sorted(self._first_tokens)
            c = self._counts
            return EngineMetrics(
                submitted=c["submitted"],
                completed=c["completed"],
                cancelled=c["cancelled"],
                failed=c["failed"],
                expired=c["expired"],
                overloaded=c["overloaded"],
                waiting=self._scheduler.num_waiting,
                running=self._scheduler.num_running,
                steps=c["steps"],
                decode_calls=c["decode_calls"],
                generated_tokens=c["generated_tokens"],
                prompt_tokens=c["prompt_tokens"],
                cached_prompt_tokens=c["cached_prompt_tokens"],
                prefix_lookups=c["prefix_lookups"],
                prefix_hits=c["prefix_hits"],
                prefix_joins=c["prefix_joins"],
                sessions_parked=self._cache.parks,
                sessions_restored=self._cache.restores,
                parked_bytes=self._cache.parked_bytes,
                adapter_switches=c["adapter_switches"],
                adapter_loads=c["adapter_loads"],
                adapter_unloads=c["adapter_unloads"],
                adapter_requests=dict(sorted(self._adapter_requests.items())),
                preemptions=c["preemptions"],
                cancel_stops=c["cancel_stops"],
                kv_cells_reserved=self._scheduler.kv_reserved,
                kv_cells_idle=self._cache.idle_cells,
                kv_capacity=self.config.scheduler.kv_capacity,
                busy_s=self._busy_s,
                batch_sizes=dict(sorted(self._batch_sizes.items())),
                queue_wait_p50_s=percentile(waits, 0.5),
                queue_wait_p95_s=percentile(waits, 0.95),
                first_token_p50_s=percentile(firsts, 0.5),
                first_token_p95_s=percentile(firsts, 0.95),
            )
