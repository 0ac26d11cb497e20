"""The shared engine: many NPCs' requests, one model, continuous batching.

`submit` validates a request on the caller's thread (tokenize, grammar, adapters: errors come
back before anything is queued) and hands it to the scheduler. One worker thread runs the loop:
schedule a step, evaluate each adapter group in one backend call, sample every sequence that is
due a token, fold the outcome back, and hand deltas to the waiting streams. The event loop never
waits on the model: backend calls release the GIL and run on the worker.

LoRA adapters are loaded and unloaded while the engine runs (`load_adapter`, `unload_adapter`
and their async forms): the worker does it between two steps, so no decode ever sees an adapter
change under it. Unloading an adapter that queued or running requests use is refused with
`AdapterInUseError` (nothing is deferred: the caller tries again, or unloads another one).
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import json
import logging
import math
import random
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Literal, Protocol

from mythic.config import EngineSettings
from mythic.engine._backend import (
    Backend,
    BackendError,
    DecodeInterrupted,
    KVCacheFullError,
    SequenceChunk,
)
from mythic.engine._chat_format import ChatMessage
from mythic.engine._errors import (
    AdapterError,
    AdapterInUseError,
    ContextOverflowError,
    DeadlineExceeded,
    EngineClosedError,
    EngineError,
    GrammarError,
    InvalidRequestError,
    Overloaded,
    UnknownAdapterError,
)
from mythic.engine._kvcache import CachedSequence, SequenceCache
from mythic.engine._request import (
    Delta,
    FinishReason,
    GenerationRequest,
    RequestStream,
    StreamItem,
    SyncRequestStream,
    Timing,
)
from mythic.engine._scheduler import (
    AdapterKey,
    Priority,
    ScheduledEntry,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from mythic.engine._schema import enforceable_schema

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
"""How often the worker wakes while requests wait, to expire deadlines on time."""
_SAMPLES = 2048
"""Recent requests kept for latency percentiles."""


@dataclass(slots=True)
class EngineConfig:
    """How the engine uses its backend."""

    scheduler: SchedulerConfig
    overflow: Literal["error", "truncate"] = "error"
    prefix_min_tokens: int = 32
    shift_min_tokens: int = 32
    seed: int = -1
    gold_preempts: bool = True

    @classmethod
    def for_backend(cls, backend: Backend, settings: EngineSettings | None = None) -> EngineConfig:
        s = settings or EngineSettings()
        return cls(
            scheduler=SchedulerConfig(
                max_batch_tokens=backend.n_batch,
                max_batch_seqs=min(64, backend.n_batch),
                prefill_chunk=min(s.prefill_chunk, backend.n_batch),
                prefill_beside_gold=s.prefill_beside_gold,
                max_seq_chunk=backend.max_seq_chunk,
                burst_tokens=s.burst_tokens,
                max_running=max(2, backend.n_seq_max - 2),
                max_waiting=s.max_waiting,
                kv_capacity=backend.n_ctx,
                gold_kv_reserve=min(256, backend.n_ctx // 8),
                mixed_adapters=backend.mixed_adapters,
            ),
            overflow=s.overflow,
            prefix_min_tokens=s.prefix_min_tokens,
            shift_min_tokens=s.shift_min_tokens,
            seed=s.seed,
            gold_preempts=s.gold_preempts,
        )


class _Sink(Protocol):
    request_id: str

    def _put(self, item: StreamItem) -> bool: ...


@dataclass(slots=True)
class _Active:
    """Engine-side state of one request."""

    request: GenerationRequest
    sink: _Sink
    prompt: list[int]
    prefix_len: int
    adapter_key: AdapterKey
    sampler: object
    stops: tuple[str, ...]
    max_tokens: int
    submitted: float
    seq: CachedSequence | None = None
    cached: int = 0
    to_eval: list[int] = field(default_factory=list)
    """Prompt tokens not yet evaluated."""
    last_token: int | None = None
    """Sampled, not yet evaluated."""
    generated: int = 0
    text: str = ""
    sent: int = 0
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_delta_at: float = 0.0
    pending_tokens: int = 0
    done: bool = False


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
        self._lock = threading.Condition()
        self._scheduler = Scheduler(self.config.scheduler, on_admit=self._on_admit)
        self._cache = SequenceCache(
            backend,
            backend.n_seq_max,
            self.config.prefix_min_tokens,
            shift_min_tokens=self.config.shift_min_tokens,
        )
        self._active: dict[str, _Active] = {}
        self._cancelled: list[_Active] = []
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

    def _enqueue(self, request: GenerationRequest, sink: _Sink) -> None:
        if self._closing or self._dead is not None:
            raise EngineClosedError("the engine is closed")
        active = self._prepare(request, sink)
        entry = ScheduledEntry(
            request_id=request.request_id,
            priority=request.priority,
            arrival=active.submitted,
            prompt_tokens=len(active.prompt),
            max_tokens=active.max_tokens,
            kv_cells=len(active.prompt) + active.max_tokens,
            adapter_key=active.adapter_key,
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
                self._adapter_key(request.adapters)
            except UnknownAdapterError:
                self.backend.free_sampler(active.sampler)
                raise
            try:
                self._scheduler.add(entry)
            except Overloaded:
                self._counts["overloaded"] += 1
                self.backend.free_sampler(active.sampler)
                raise
            self._active[request.request_id] = active
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

    def _prepare(self, request: GenerationRequest, sink: _Sink) -> _Active:
        s = request.sampling
        if not request.npc_id:
            raise InvalidRequestError("npc_id is empty")
        if (request.messages is None) == (request.prompt is None):
            raise InvalidRequestError("give exactly one of messages and prompt")
        if not isinstance(request.priority, Priority):
            raise InvalidRequestError(f"priority must be a Priority, not {request.priority!r}")
        if request.deadline_s is not None and not request.deadline_s > 0:
            raise InvalidRequestError("deadline_s must be a positive number of seconds")
        if s.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1")
        if not (math.isfinite(s.temperature) and s.temperature >= 0):
            raise InvalidRequestError("temperature must be 0 (greedy) or more")
        if not 0 < s.top_p <= 1 or s.top_k < 0 or not s.repeat_penalty > 0:
            raise InvalidRequestError("top_p must be in (0, 1], top_k >= 0, repeat_penalty > 0")
        if not (
            math.isfinite(s.dry_multiplier)
            and s.dry_multiplier >= 0
            and math.isfinite(s.dry_base)
            and s.dry_base >= 1
            and s.dry_allowed_length >= 1
            and s.dry_penalty_last_n >= -1
            and all(s.dry_sequence_breakers)
            and s.dry_scope in ("lines", "prompt", "reply")
        ):
            raise InvalidRequestError(
                "DRY needs dry_multiplier >= 0, dry_base >= 1, dry_allowed_length >= 1, "
                "dry_penalty_last_n >= -1, no empty sequence breaker and a dry_scope of "
                "lines, prompt or reply"
            )
        if any(not stop for stop in s.stop):
            raise InvalidRequestError("stop strings must not be empty")
        if request.continue_text and request.messages is None:
            raise InvalidRequestError("continue_text needs messages, not a raw prompt")
        if request.json_schema is not None and request.grammar is not None:
            raise InvalidRequestError("give a JSON schema or a grammar, not both")
        adapter_key = self._adapter_key(request.adapters)

        prompt, prefix_len, stops = self._tokenize(request)
        limit = self.config.scheduler.kv_capacity
        if request.priority is not Priority.GOLD:
            limit -= self.config.scheduler.gold_kv_reserve
        limit = min(limit, self.backend.n_ctx_seq)
        if request.room_tokens < 0:
            raise InvalidRequestError("room_tokens must be >= 0")
        need = s.max_tokens + request.room_tokens
        if need >= limit:
            raise ContextOverflowError(
                f"max_tokens={s.max_tokens} with room_tokens={request.room_tokens} leaves no "
                f"room for a prompt in {limit} tokens"
            )
        if len(prompt) + need > limit:
            prompt, prefix_len = self._fit(request, prompt, prefix_len, limit - need)

        grammar = request.grammar
        if request.json_schema is not None:
            grammar = self.backend.json_schema_grammar(_schema_text(request.json_schema))
        seed = s.seed if s.seed is not None else self.config.seed
        if seed < 0:
            seed = random.getrandbits(31)
        said = self._said(request, prompt) if s.dry_multiplier > 0 else []
        sampler = self.backend.make_sampler(s, seed, grammar, said=said)
        return _Active(
            request=request,
            sink=sink,
            prompt=prompt,
            prefix_len=prefix_len,
            adapter_key=adapter_key,
            sampler=sampler,
            stops=stops,
            max_tokens=s.max_tokens,
            submitted=time.monotonic(),
        )

    def _adapter_key(self, adapters: Mapping[str, float]) -> AdapterKey:
        loaded = self._loaded
        key = []
        for name, scale in adapters.items():
            if name not in loaded:
                known = ", ".join(sorted(loaded)) or "none"
                raise UnknownAdapterError(
                    f"no adapter named {name!r} is loaded (loaded: {known})",
                    fix="add it under engine.adapters in mythic.yaml, or load it with "
                    "Engine.load_adapter",
                )
            if not math.isfinite(scale):
                raise InvalidRequestError(f"adapter {name!r} has a non-finite scale")
            if scale != 0:
                key.append((name, float(scale)))
        return tuple(sorted(key))

    def _tokenize(self, request: GenerationRequest) -> tuple[list[int], int, tuple[str, ...]]:
        """Prompt tokens, the length of its shareable system prefix, and the stop strings."""
        stops = tuple(request.sampling.stop)
        if request.prompt is not None:
            tokens = self.backend.tokenize(request.prompt, add_special=True, parse_special=True)
            if not tokens:
                raise InvalidRequestError("the prompt is empty")
            return tokens, 0, stops
        messages = list(request.messages or ())
        if not messages:
            raise InvalidRequestError("messages is empty")
        fmt = self.backend.chat_format
        if fmt is None:
            raise InvalidRequestError(
                f"model {self.backend.name} has no chat template: send a raw prompt",
                fix="set engine.chat_format for a GGUF whose template is not recognised",
            )
        tokens = self._render(messages)
        if request.continue_text:
            tokens += self.backend.tokenize(
                request.continue_text, add_special=False, parse_special=False
            )
        # The shareable prefix is the first message, a system prompt (an NPC's persona):
        # what follows (a player's memory, the conversation with its lore) is the session's
        # own, and a prefix reaching into it would pin those cells (a window move could
        # not cut them out of the session's sequence).
        prefix_len = 0
        if len(messages) > 1 and messages[0].role == "system":
            head = self._render(messages[:1], add_generation_prompt=False)
            if tokens[: len(head)] == head:
                prefix_len = len(head)
        return tokens, prefix_len, tuple(dict.fromkeys((*stops, *fmt.stop_strings)))

    def _said(self, request: GenerationRequest, prompt: list[int]) -> list[int]:
        """The tokens DRY counts as already said before the reply (`Sampling.dry_scope`)."""
        scope = request.sampling.dry_scope
        if scope == "prompt":
            return prompt
        tokenize = self.backend.tokenize
        said: list[int] = []
        if scope == "lines":
            # A line break between lines: a breaker, so no repeat runs from one into the next.
            brk = tokenize("\n", add_special=False, parse_special=False)
            for message in request.messages or ():
                if message.role == "assistant":
                    said += tokenize(message.content, add_special=False, parse_special=False)
                    said += brk
        if request.continue_text:
            # The reply's own start, given in the prompt.
            said += tokenize(request.continue_text, add_special=False, parse_special=False)
        return said

    def _render(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[int]:
        fmt = self.backend.chat_format
        assert fmt is not None
        tokens: list[int] = []
        for text, template in fmt.render_segments(
            messages, add_generation_prompt=add_generation_prompt
        ):
            tokens += self.backend.tokenize(text, add_special=False, parse_special=template)
        return tokens

    def _fit(
        self, request: GenerationRequest, prompt: list[int], prefix_len: int, budget: int
    ) -> tuple[list[int], int]:
        if self.config.overflow == "error":
            room = f" and room_tokens={request.room_tokens}" if request.room_tokens else ""
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens; with max_tokens="
                f"{request.sampling.max_tokens}{room} at most {budget} fit",
                fix="shorten the history, lower max_tokens, raise engine.n_ctx, or set "
                "engine.overflow: truncate",
            )
        if request.prompt is not None:
            # A raw prompt keeps its end: the most recent text matters most.
            return prompt[len(prompt) - budget :], 0
        messages = list(request.messages or ())
        system = [m for m in messages if m.role == "system"]
        rest = [m for m in messages if m.role != "system"]
        while len(rest) > 1:
            rest = rest[1:]
            tokens = self._render([*system, *rest])
            if request.continue_text:
                tokens += self.backend.tokenize(
                    request.continue_text, add_special=False, parse_special=False
                )
            if len(tokens) <= budget:
                return tokens, prefix_len
        raise ContextOverflowError(
            f"even the system prompt and the last message need more than {budget} tokens",
            fix="shorten the persona or the message, or raise engine.n_ctx",
        )

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
                    out = self._scheduler.schedule(now)
                    expired = [self._active[rid] for rid in out.expired]
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
        with self._lock:
            self._scheduler.update(out, finished, step_s)

    def _evaluate(self, out: SchedulerOutput, finished: list[str]) -> int:
        """Run the step's batches; returns how many ran (fewer when gold preempted the step)."""
        for done, batch in enumerate(out.batches):
            items: list[tuple[_Active, list[int], bool]] = []
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

    def _accept(self, active: _Active, token: int) -> bool:
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
        if self.backend.is_end_of_generation(token):
            self._finish(active, "stop")
            return True
        active.generated += 1
        active.pending_tokens += 1
        self._counts["generated_tokens"] += 1
        active.last_token = token
        active.text += active.decoder.decode(self.backend.piece(token))
        if active.stops:
            window = max(0, active.sent - max(len(stop) for stop in active.stops))
            cut = min(
                (i for i in (active.text.find(stop, window) for stop in active.stops) if i >= 0),
                default=-1,
            )
            if cut >= 0:
                active.text = active.text[:cut]
                self._finish(active, "stop")
                return True
        if active.generated >= active.max_tokens:
            active.text += active.decoder.decode(b"", final=True)
            self._finish(active, "length")
            return True
        hold = _held_back(active.text, active.stops)
        if len(active.text) - hold > active.sent:
            self._emit(active, active.text[active.sent : len(active.text) - hold], None)
        return False

    def _emit(self, active: _Active, text: str, reason: FinishReason | None) -> None:
        now = time.monotonic()
        since = now - (active.last_delta_at or active.submitted)
        timing = Timing(
            queue_wait_s=(active.scheduled_at or now) - active.submitted,
            first_token_s=(
                active.first_token_at - active.submitted if active.first_token_at else None
            ),
            token_s=since / max(active.pending_tokens, 1),
            elapsed_s=now - active.submitted,
        )
        final = reason is not None
        delivered = active.sink._put(
            Delta(
                request_id=active.request.request_id,
                text=text,
                tokens=active.pending_tokens,
                timing=timing,
                finish_reason=reason,
                prompt_tokens=len(active.prompt) if final else 0,
                cached_tokens=active.cached if final else 0,
            )
        )
        active.sent += len(text)
        active.pending_tokens = 0
        active.last_delta_at = now
        if not delivered and not final:
            # The caller went away without cancelling (its event loop closed): stop now.
            with self._lock:
                if not active.done:
                    active.done = True
                    self._scheduler.remove(active.request.request_id)
                    self._cancelled.append(active)

    # The request is closed (sequence released, scheduler entry removed) before its caller
    # hears the end, so whoever reads the final delta sees the engine without it.

    def _finish(self, active: _Active, reason: FinishReason, *, keep: int | None = None) -> None:
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
        self._emit(active, active.text[active.sent :], reason)

    def _fail(self, active: _Active, error: BaseException) -> None:
        self._counts["expired" if isinstance(error, DeadlineExceeded) else "failed"] += 1
        self._close_request(active, keep=None, discard=not isinstance(error, DeadlineExceeded))
        active.sink._put(error)

    def _close_request(self, active: _Active, *, keep: int | None, discard: bool = False) -> None:
        active.done = True
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
        room = self.config.scheduler.kv_capacity - self._scheduler.kv_reserved
        self._cache.evict(room)

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

    def _release_adapters(self, active: _Active) -> None:
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
                queue_wait_p50_s=_percentile(waits, 0.5),
                queue_wait_p95_s=_percentile(waits, 0.95),
                first_token_p50_s=_percentile(firsts, 0.5),
                first_token_p95_s=_percentile(firsts, 0.95),
            )


def _schema_text(schema: Mapping[str, Any] | str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, Mapping):
        raise GrammarError("a JSON schema must be an object")
    return json.dumps(enforceable_schema(dict(schema)))


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that could be the start of a stop string."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]
