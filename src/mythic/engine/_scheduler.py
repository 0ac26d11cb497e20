"""The token scheduler: which NPC sequences advance in the next model step, and by how much.

Synchronous and free of I/O (the shape of vLLM's `schedule()` / `update_from_output()`): the
engine loop calls `schedule(now)`, runs the backend on the result, and folds what happened back
with `update()`. Everything here is plain bookkeeping, so it is unit-tested without a model.

Policy, in order:
1. Deadlines: a request past its deadline, or one whose first token cannot arrive before it at
   the measured speed, is expired now (the caller uses its fallback line) rather than served late.
2. Admission: waiting requests become running in priority order while a sequence slot and their
   KV reservation (prompt still to evaluate + max_tokens) fit; lower classes leave a reserve of
   cells and slots that only gold may use. The waiting queue is bounded: `add` raises
   `Overloaded` instead of letting latency grow without bound.
3. Gold runs first, every step (strict priority). A step that advances a gold request
   evaluates few other prompt tokens (`prefill_beside_gold`): each gold token waits for its
   whole step, so a decision of 15 tokens would otherwise last 15 steps of other NPCs' prompts.
4. The other classes share what is left by weighted fair share (stride scheduling over tokens
   processed). Each class with work gets at least `min_slice_seqs` sequences per step, so a
   bronze job cannot starve behind a crowd of speakers. A sequence that won a slot keeps it for
   a burst of `burst_tokens` before competing again, which keeps batches stable.
5. Chunked prefill: while other sequences stream, prompts evaluate `prefill_chunk` tokens
   per step each, all together (gold: the whole step budget), so one long prompt cannot
   freeze every other stream; the most urgent, oldest prompt takes them first. With none
   streaming, or only streams less urgent than that prompt (ambient chatter beside a
   player's line), prompts fill the step, most urgent and oldest first. A sequence's share
   of one step is capped by `max_seq_chunk`.
6. Scheduled sequences are grouped by adapter set: one backend decode call per group; gold
   sequences form groups of their own, evaluated first.
7. Adapter groups take turns (`adapter_quantum`): when the other classes' work spans several
   adapter sets and the backend applies one set per call (llama.cpp), a step advances one
   set's sequences, for up to `adapter_quantum` steps running; then the set whose sequences
   have received the least service per weight goes next, or at once a set holding a more
   urgent class. llama.cpp re-plans its compute graph on every change of adapter set (about
   4 ms on SmolLM2, against 18 ms for a decode of 4 sequences), and smaller calls cost more
   per token: measured (bench/adapters.py), 5 sets went from 0.63x to 0.75x of the base
   model's throughput.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from mythic.engine._errors import Overloaded


class Priority(IntEnum):
    """Request classes, most urgent first (ARCHITECTURE.md: the four paths)."""

    GOLD = 0
    """Intents, barks, 1-8 token decisions: strict priority, deadline-bound."""
    SPEAKING = 1
    """The NPC the player is talking to, on screen."""
    SILVER = 2
    """Other dialogue turns."""
    IDLE = 3
    """Off-screen chatter, ambient lines."""
    BRONZE = 4
    """Summaries, storyteller jobs: throughput, not latency."""


AdapterKey = tuple[tuple[str, float], ...]
"""An adapter set, normalised: sorted (name, scale) pairs. `()` is the base model."""

DEFAULT_WEIGHTS: dict[Priority, float] = {
    Priority.SPEAKING: 8.0,
    Priority.SILVER: 4.0,
    Priority.IDLE: 2.0,
    Priority.BRONZE: 1.0,
}


@dataclass(slots=True)
class SchedulerConfig:
    """Budgets of one scheduler step and of the engine's queues."""

    max_batch_tokens: int = 512
    """Tokens evaluated per step, all sequences together (the backend's batch size)."""
    max_batch_seqs: int = 64
    """Sequences advanced per step."""
    prefill_chunk: int = 64
    """Prompt tokens one non-gold sequence may evaluate per step."""
    prefill_beside_gold: int = 16
    """Prompt tokens of non-gold sequences (all together) a step that advances a gold request
    may evaluate; their decodes are not held back."""
    max_seq_chunk: int | None = None
    """Most tokens of one sequence in one step, gold included (None: no limit). The
    batch-invariant llama.cpp backend needs this below 64."""
    burst_tokens: int = 48
    """Tokens a sequence may generate in one turn before competing for its slot again."""
    min_slice_seqs: int = 1
    """Sequences per step guaranteed to every non-gold class that has work."""
    max_running: int = 64
    """Requests holding a sequence at once."""
    max_waiting: int = 256
    """Requests waiting for admission; one more is refused with `Overloaded`."""
    kv_capacity: int = 4096
    """KV cells the running requests may reserve."""
    gold_kv_reserve: int = 256
    """Cells (and one running slot) kept free for gold requests."""
    weights: dict[Priority, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    """Fair-share weight of each non-gold class."""
    mixed_adapters: bool = False
    """The backend mixes adapter sets in one call: batches split by gold-ness only, and
    each chunk carries its own adapter set."""
    adapter_quantum: int = 8
    """Steps one adapter set's sequences run before another set with work takes its turn
    (not gold, not with `mixed_adapters`); a set holding a more urgent class (the NPC on
    screen) takes it at once. 0: every set advances every step, one call each."""

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_seqs", "prefill_chunk", "burst_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_running < 2:
            raise ValueError("max_running must be at least 2 (one slot is kept for gold)")
        if self.prefill_beside_gold < 1:
            raise ValueError("prefill_beside_gold must be at least 1 (0 would stall prompts)")
        if self.kv_capacity <= self.gold_kv_reserve:
            raise ValueError("kv_capacity must exceed gold_kv_reserve")


@dataclass(slots=True)
class ScheduledEntry:
    """The scheduler's view of one request."""

    request_id: str
    priority: Priority
    arrival: float
    prompt_tokens: int
    """Prompt tokens still to evaluate when the request was added (after prefix reuse)."""
    max_tokens: int
    kv_cells: int
    """Cells reserved while running: prompt tokens to evaluate plus max_tokens."""
    adapter_key: AdapterKey = ()
    deadline: float | None = None
    """Monotonic time by which the request must finish, or None."""
    step_tokens: int | None = None
    """Most prompt tokens of this entry per step (None: no cap of its own)."""
    prefilled: int = 0
    generated: int = 0
    vtime: float = 0.0
    burst: int = 0
    running: bool = False
    held: bool = False
    """Admitted but not scheduled yet: it waits for another request to evaluate the start of
    its prompt, which it then copies (the engine clears this)."""

    @property
    def prefill_left(self) -> int:
        return self.prompt_tokens - self.prefilled

    @property
    def decoding(self) -> bool:
        return self.prefill_left == 0


@dataclass(slots=True)
class ScheduledChunk:
    """Work for one sequence in one step."""

    request_id: str
    n_tokens: int
    prefill: bool
    """True: `n_tokens` prompt tokens; False: the one token sampled last step."""
    sample: bool
    """True when this chunk ends the prompt or decodes: a token is sampled after it."""
    adapter_key: AdapterKey = ()


@dataclass(slots=True)
class ScheduledBatch:
    """Chunks that share an adapter set (and gold-ness): one backend decode call. With
    `mixed_adapters` the set is None and each chunk names its own."""

    adapter_key: AdapterKey | None
    gold: bool = False
    chunks: list[ScheduledChunk] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.n_tokens for chunk in self.chunks)


@dataclass(slots=True)
class SchedulerOutput:
    """The decision of one step."""

    batches: list[ScheduledBatch] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    """Requests that became running this step: the engine gives them a sequence."""
    expired: list[str] = field(default_factory=list)
    """Requests removed because they cannot meet their deadline."""

    @property
    def num_tokens(self) -> int:
        return sum(batch.num_tokens for batch in self.batches)

    @property
    def num_seqs(self) -> int:
        return sum(len(batch.chunks) for batch in self.batches)

    def chunks(self) -> Iterable[ScheduledChunk]:
        for batch in self.batches:
            yield from batch.chunks


_EMA = 0.2


class Scheduler:
    """Decides each step's batch. Not thread-safe: the engine loop owns it."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        on_admit: Callable[[ScheduledEntry], None] | None = None,
    ) -> None:
        """`on_admit` is called as a request becomes running, before its first chunk is
        chosen; it may lower `prompt_tokens` (the engine found a cached prefix)."""
        self.config = config or SchedulerConfig()
        self._on_admit = on_admit
        self._waiting: dict[str, ScheduledEntry] = {}
        self._running: dict[str, ScheduledEntry] = {}
        self._kv_reserved = 0
        self._vclock = 0.0
        self._sec_per_token = 0.0
        self._sec_per_step = 0.0
        self._group: AdapterKey | None = None
        """The adapter set whose turn it is (`adapter_quantum`)."""
        self._group_steps = 0

    # -- queue ---------------------------------------------------------------------------------

    def add(self, entry: ScheduledEntry) -> None:
        """Queue a request.

        Raises:
            Overloaded: the waiting queue is full.
            ValueError: the request id is already queued, or it could never be admitted.
        """
        if entry.request_id in self._waiting or entry.request_id in self._running:
            raise ValueError(f"request {entry.request_id!r} is already scheduled")
        if entry.kv_cells > self._kv_limit(entry.priority):
            raise ValueError(
                f"request needs {entry.kv_cells} KV cells; at most "
                f"{self._kv_limit(entry.priority)} are available to {entry.priority.name}"
            )
        if len(self._waiting) >= self.config.max_waiting:
            raise Overloaded(
                f"{len(self._waiting)} requests are already waiting for the engine",
                fix="retry later, lower the NPC's priority, or raise engine.max_waiting",
            )
        entry.running = False
        self._waiting[entry.request_id] = entry

    def remove(self, request_id: str) -> ScheduledEntry | None:
        """Drop a request (finished, cancelled or failed); returns it if it was known."""
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            entry = self._running.pop(request_id, None)
            if entry is not None:
                self._kv_reserved -= entry.kv_cells
        return entry

    def get(self, request_id: str) -> ScheduledEntry | None:
        return self._running.get(request_id) or self._waiting.get(request_id)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def kv_reserved(self) -> int:
        """KV cells reserved by running requests."""
        return self._kv_reserved

    def request_ids(self) -> list[str]:
        return [*self._running, *self._waiting]

    # -- one step ------------------------------------------------------------------------------

    def schedule(self, now: float) -> SchedulerOutput:
        """Choose the next step's work. Call `update` with the outcome before the next call."""
        out = SchedulerOutput()
        self._expire(now, out)
        self._admit(out)
        chosen = self._choose()
        # Gold gets decode calls of its own, first: its token is sampled and sent before the
        # (larger) calls of the other classes run.
        by_key: dict[tuple[bool, AdapterKey | None], ScheduledBatch] = {}
        mixed = self.config.mixed_adapters
        for chunk, entry in chosen:
            key = (entry.priority is Priority.GOLD, None if mixed else entry.adapter_key)
            batch = by_key.get(key)
            if batch is None:
                batch = by_key[key] = ScheduledBatch(key[1], gold=key[0])
                out.batches.append(batch)
            batch.chunks.append(chunk)
        return out

    def update(
        self, output: SchedulerOutput, finished: Collection[str], step_seconds: float
    ) -> None:
        """Fold a step's outcome back: tokens done, requests finished, how long it took."""
        scheduled: set[str] = set()
        for chunk in output.chunks():
            entry = self._running.get(chunk.request_id)
            if entry is None:
                continue
            scheduled.add(chunk.request_id)
            if chunk.prefill:
                entry.prefilled += chunk.n_tokens
            if chunk.sample:
                entry.generated += 1
                entry.burst += 1
            if entry.priority is not Priority.GOLD:
                entry.vtime += chunk.n_tokens / self.config.weights[entry.priority]
        for entry in self._running.values():
            if entry.request_id not in scheduled or entry.burst >= self.config.burst_tokens:
                entry.burst = 0
        for request_id in finished:
            self.remove(request_id)
        others = [e.vtime for e in self._running.values() if e.priority is not Priority.GOLD]
        if others:
            self._vclock = max(self._vclock, min(others))
        tokens = output.num_tokens
        if tokens and step_seconds > 0:
            self._sec_per_token = _ema(self._sec_per_token, step_seconds / tokens)
            if tokens == output.num_seqs:
                self._sec_per_step = _ema(self._sec_per_step, step_seconds)

    # -- policy --------------------------------------------------------------------------------

    def _kv_limit(self, priority: Priority) -> int:
        reserve = 0 if priority is Priority.GOLD else self.config.gold_kv_reserve
        return self.config.kv_capacity - reserve

    def _first_token_estimate(self, entry: ScheduledEntry) -> float:
        """A lower bound on the seconds until the entry's next token, from measured speed."""
        if entry.prefill_left == 0:
            return self._sec_per_step
        chunk = self._chunk_limit(entry.priority)
        steps = math.ceil(entry.prefill_left / chunk)
        return entry.prefill_left * self._sec_per_token + (steps - 1) * self._sec_per_step

    def _chunk_limit(self, priority: Priority, *, whole: bool = False) -> int:
        cfg = self.config
        limit = cfg.max_batch_tokens if whole or priority is Priority.GOLD else cfg.prefill_chunk
        return min(limit, cfg.max_seq_chunk) if cfg.max_seq_chunk else limit

    def _expire(self, now: float, out: SchedulerOutput) -> None:
        for queue in (self._waiting, self._running):
            for entry in list(queue.values()):
                if entry.deadline is None:
                    continue
                late = now >= entry.deadline
                if not late and entry.generated == 0:
                    late = now + self._first_token_estimate(entry) > entry.deadline
                if late:
                    self.remove(entry.request_id)
                    out.expired.append(entry.request_id)

    def _admit(self, out: SchedulerOutput) -> None:
        blocked_class: Priority | None = None
        for entry in sorted(self._waiting.values(), key=lambda e: (e.priority, e.arrival)):
            if blocked_class is not None and entry.priority > blocked_class:
                break
            gold = entry.priority is Priority.GOLD
            slots = self.config.max_running - (0 if gold else 1)
            fits = len(
                self._running
            ) < slots and self._kv_reserved + entry.kv_cells <= self._kv_limit(entry.priority)
            if not fits:
                blocked_class = entry.priority if blocked_class is None else blocked_class
                continue
            del self._waiting[entry.request_id]
            entry.running = True
            entry.vtime = max(entry.vtime, self._vclock)
            self._running[entry.request_id] = entry
            self._kv_reserved += entry.kv_cells
            out.admitted.append(entry.request_id)
            if self._on_admit is not None:
                self._on_admit(entry)

    def _choose(self) -> list[tuple[ScheduledChunk, ScheduledEntry]]:
        cfg = self.config
        seqs_left = cfg.max_batch_seqs
        tokens_left = cfg.max_batch_tokens
        chosen: list[tuple[ScheduledChunk, ScheduledEntry]] = []

        def take(entry: ScheduledEntry, chunk_limit: int) -> None:
            nonlocal seqs_left, tokens_left
            if seqs_left == 0 or tokens_left == 0:
                return
            if entry.decoding:
                chunk = ScheduledChunk(
                    entry.request_id, 1, prefill=False, sample=True, adapter_key=entry.adapter_key
                )
            else:
                n = min(
                    entry.prefill_left, chunk_limit, tokens_left, entry.step_tokens or chunk_limit
                )
                chunk = ScheduledChunk(
                    entry.request_id,
                    n,
                    prefill=True,
                    sample=n == entry.prefill_left,
                    adapter_key=entry.adapter_key,
                )
            chosen.append((chunk, entry))
            seqs_left -= 1
            tokens_left -= chunk.n_tokens

        running = sorted(
            (e for e in self._running.values() if not e.held), key=lambda e: (e.priority, e.arrival)
        )
        gold = [e for e in running if e.priority is Priority.GOLD]
        # Decodes before prefills within gold too: a prompt must not delay a nearly done intent.
        for entry in sorted(gold, key=lambda e: not e.decoding):
            take(entry, self._chunk_limit(Priority.GOLD))

        others = self._adapter_turn([e for e in running if e.priority is not Priority.GOLD])
        # In a burst first (keep the slot), then least service received per weight.
        others.sort(key=lambda e: (e.burst == 0, e.vtime, e.arrival))
        picked: list[ScheduledEntry] = []
        per_class: dict[Priority, int] = {}
        for entry in others:
            if per_class.get(entry.priority, 0) < cfg.min_slice_seqs:
                per_class[entry.priority] = per_class.get(entry.priority, 0) + 1
                picked.append(entry)
        picked_ids = {e.request_id for e in picked}
        picked.extend(e for e in others if e.request_id not in picked_ids)
        del picked[seqs_left:]
        # Among the chosen, decoding sequences take their single token first; prompts share
        # the remaining token budget, the oldest of the most urgent class first.
        decoding = [e for e in picked if e.decoding]
        for entry in decoding:
            take(entry, 1)
        waiting = sorted(
            (e for e in picked if not e.decoding), key=lambda e: (e.priority, e.arrival)
        )
        urgent = waiting[0].priority if waiting else None
        if gold:
            prompts = cfg.prefill_beside_gold
        elif urgent is not None and any(e.priority <= urgent for e in decoding):
            # Streams wait for the whole step: prompts get `prefill_chunk` tokens each, all
            # together, as many as if each took its chunk; but first come, first served
            # (llama-server fills its batch so), not spread evenly: the first NPC in line
            # gets its first token soonest, and the streams' steps last no longer.
            prompts = min(tokens_left, sum(self._chunk_limit(e.priority) for e in waiting))
        else:
            # Nobody streams, or only less urgent classes (a scene's ambient chatter beside a
            # player's line): the step is the prompts'. Those streams still advance a token
            # each; they wait for the prompt's step, not the prompt for theirs.
            prompts = tokens_left
        for entry in waiting:
            limit = min(self._chunk_limit(entry.priority, whole=not gold), prompts)
            if limit == 0:
                break
            before = tokens_left
            take(entry, limit)
            prompts -= before - tokens_left
        return chosen

    def _adapter_turn(self, others: list[ScheduledEntry]) -> list[ScheduledEntry]:
        """The entries of the adapter set whose turn it is, of `others` (non-gold, runnable):
        all of them when they share one set, the backend mixes sets, or turns are off."""
        quantum = self.config.adapter_quantum
        groups = {e.adapter_key for e in others}
        if self.config.mixed_adapters or quantum == 0 or not groups:
            return others
        if self._group not in groups or len(groups) == 1:
            if len(groups) == 1:
                (group,) = groups
                self._group_steps = self._group_steps + 1 if group == self._group else 1
                self._group = group
                return others
            self._group_steps = quantum  # its set has no work left: choose another now
        current = [e for e in others if e.adapter_key == self._group]
        waiting = [e for e in others if e.adapter_key != self._group]
        best = min((e.priority for e in current), default=None)
        floor = min((e.vtime for e in current), default=0.0)
        if best is not None and any(e.priority < best and e.vtime <= floor for e in waiting):
            # A more urgent NPC (on screen) that is not ahead in service waits in another
            # set: its set's turn now, not after the quantum.
            self._group_steps = quantum
        if self._group_steps >= quantum:
            # The least served (per weight) of the other sets goes next; stride scheduling's
            # virtual time makes this a weighted round robin over the sets.
            first = min(waiting, key=lambda e: (e.vtime, e.priority, e.arrival))
            self._group, self._group_steps = first.adapter_key, 0
        self._group_steps += 1
        return [e for e in others if e.adapter_key == self._group]


def _ema(previous: float, sample: float) -> float:
    return sample if previous == 0.0 else previous + _EMA * (sample - previous)
