"""Which sequence of the shared KV memory holds what: NPC sessions and shared prefixes.

A session's sequence survives between its turns, so a follow-up evaluates only its new tokens.
A persona/archetype prefix evaluated once is kept in a sequence of its own and copied into new
sessions (`seq_copy` shares cells, nothing is recomputed). A session's prompt that leaves out a
stretch of its cached tokens (the conversation's window moved past old exchanges) keeps what
follows the stretch, moved down in place (`seq_cut`), when the backend can shift positions.
Entries are keyed by adapter set: KV computed under one set of adapters is never reused under
another. Idle entries are evicted least recently used first, when a sequence id or KV cells
are needed; an evicted session's cells are parked in host memory (`park_bytes`, least recently
parked dropped first) and loaded back into a sequence when the NPC speaks again, instead of
being evaluated again (the design's off-screen "KV evict and resume").
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from mythic.engine._backend import Backend
from mythic.engine._scheduler import AdapterKey

SessionKey = tuple[str, str]


@dataclass(slots=True)
class CachedSequence:
    seq_id: int
    adapter_key: AdapterKey
    session: SessionKey | None
    """None: a shared prefix."""
    tokens: list[int] = field(default_factory=list)
    """Tokens held in the KV memory, at positions 0..len-1."""
    busy: bool = False
    shared: int = 0
    """Leading positions whose cells it may share with a prefix's sequence (`seq_copy`): a
    shift must not move them (it would move them for the prefix too)."""


@dataclass(slots=True)
class Parked:
    """An evicted session's cells, in host memory."""

    adapter_key: AdapterKey
    tokens: list[int]
    data: bytes


@dataclass(slots=True)
class Acquired:
    seq: CachedSequence
    cached: int
    """Leading prompt tokens already in the sequence."""
    source: str
    """"session", "parked", "prefix" or "none"."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SequenceCache:
    """Owns the backend's sequence ids. Used only from the engine's worker thread."""

    def __init__(
        self,
        backend: Backend,
        n_seq: int,
        prefix_min_tokens: int,
        *,
        shift_min_tokens: int = 0,
        park_bytes: int = 0,
    ) -> None:
        self._backend = backend
        self._n_seq = n_seq
        self.prefix_min_tokens = prefix_min_tokens
        self.shift_min_tokens = shift_min_tokens
        self.shifts = 0
        """Sessions whose cached tokens were moved down past a stretch left out (`seq_cut`)."""
        self._free = set(range(n_seq))
        self._busy: dict[int, AdapterKey] = {}
        """Sequences in use by a request, and their adapter sets."""
        self.placed_near = 0
        """Sessions given an id next to a running sequence of their adapter set (`_new_id`)."""
        self._sessions: dict[SessionKey, CachedSequence] = {}
        self._prefixes: list[CachedSequence] = []
        self._idle: OrderedDict[int, CachedSequence] = OrderedDict()
        self._idle_cells = 0
        self.evictions = 0
        self.park_bytes = park_bytes
        self._parked: OrderedDict[SessionKey, Parked] = OrderedDict()
        self.parked_bytes = 0
        self.parks = 0
        """Sessions whose cells were parked as they were evicted."""
        self.restores = 0
        """Sessions whose parked cells were loaded back for their next turn."""

    @property
    def idle_cells(self) -> int:
        """Cells held by idle entries (shared cells counted once per entry: an upper bound).

        A plain counter, so `Engine.metrics()` may read it from any thread."""
        return self._idle_cells

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def acquire(self, session: SessionKey, adapter_key: AdapterKey, prompt: list[int]) -> Acquired:
        """A sequence for a new request, holding as much of `prompt` as the cache has.

        At least the last prompt token is left to evaluate, so the request gets logits.
        """
        limit = len(prompt) - 1
        own = self._sessions.get(session)
        if own is not None and not own.busy:
            if own.adapter_key == adapter_key:
                cached = min(common_prefix(own.tokens, prompt), limit)
                self._take(own)
                cached = self._shift(own, prompt, cached, limit)
                self._truncate(own, cached)
                return Acquired(own, cached, "session" if cached else "none")
            self._drop(own)
        parked = self._unpark(session)
        seq = CachedSequence(self._new_id(adapter_key=adapter_key), adapter_key, session, busy=True)
        self._busy[seq.seq_id] = adapter_key
        best, best_len = None, 0
        for prefix in self._prefixes:
            if prefix.adapter_key != adapter_key:
                continue
            n = common_prefix(prefix.tokens, prompt)
            if n > best_len:
                best, best_len = prefix, n
        cached = min(best_len, limit)
        if parked is not None and parked.adapter_key == adapter_key:
            held = min(common_prefix(parked.tokens, prompt), limit)
            if held > cached and self._backend.seq_restore(seq.seq_id, parked.data):
                seq.tokens = parked.tokens
                self.restores += 1
                self._truncate(seq, held)
                return Acquired(seq, held, "parked")
        if best is not None and cached >= self.prefix_min_tokens:
            self._backend.seq_copy(best.seq_id, seq.seq_id, cached)
            seq.tokens = prompt[:cached]
            seq.shared = cached
            if best.seq_id in self._idle:
                self._idle.move_to_end(best.seq_id)
            return Acquired(seq, cached, "prefix")
        return Acquired(seq, 0, "none")

    def share_prefix(self, seq: CachedSequence, length: int) -> bool:
        """Keep `seq`'s first `length` tokens as a prefix other sessions can copy.

        Returns False when the prefix is already cached or no sequence id is free.
        """
        if length < self.prefix_min_tokens or length > len(seq.tokens):
            return False
        tokens = seq.tokens[:length]
        for prefix in self._prefixes:
            if prefix.adapter_key == seq.adapter_key and prefix.tokens == tokens:
                return False
        if not self._free and not self._idle:
            return False
        prefix = CachedSequence(self._new_id(high=True), seq.adapter_key, None, tokens)
        self._backend.seq_copy(seq.seq_id, prefix.seq_id, length)
        seq.shared = max(seq.shared, length)
        self._prefixes.append(prefix)
        self._make_idle(prefix)
        return True

    def adopt(self, seq: CachedSequence, source: CachedSequence, length: int) -> None:
        """Make `seq` (a busy sequence not evaluated yet) hold the first `length` tokens of
        `source` (another busy one, which evaluated them) instead of what it holds."""
        if length > len(source.tokens):
            raise ValueError(f"{source.seq_id} holds {len(source.tokens)} tokens, not {length}")
        self._backend.seq_remove(seq.seq_id, 0)
        self._backend.seq_copy(source.seq_id, seq.seq_id, length)
        seq.tokens = source.tokens[:length]
        # Both now hold cells the other may share: a shift must move neither's.
        seq.shared = length
        source.shared = max(source.shared, length)

    def release(self, seq: CachedSequence, keep: int | None = None) -> None:
        """A request is done with `seq`: keep it (or its first `keep` tokens) for the session."""
        if keep is not None:
            self._truncate(seq, keep)
        seq.busy = False
        self._busy.pop(seq.seq_id, None)
        assert seq.session is not None
        current = self._sessions.get(seq.session)
        if current is not None and current is not seq:
            if current.busy:
                # Another turn of the same session is still running; it will own the session.
                self._drop(seq)
                return
            self._drop(current)
        self._sessions[seq.session] = seq
        self._unpark(seq.session)  # older than what the session holds now
        self._make_idle(seq)

    def discard(self, seq: CachedSequence) -> None:
        """Forget a sequence whose contents cannot be trusted (failed mid-evaluation)."""
        self._drop(seq)

    def evict(self, max_idle_cells: int) -> int:
        """Evict least recently used idle entries until they hold at most `max_idle_cells`."""
        evicted = 0
        while self._idle and self._idle_cells > max(max_idle_cells, 0):
            self._evict(next(iter(self._idle.values())))
            evicted += 1
        return evicted

    def forget_adapter(self, name: str) -> int:
        """Drop the idle entries computed under adapter `name` (it is being unloaded: a later
        adapter loaded under the same name must not reuse them). Returns how many."""
        stale = [s for s in self._idle.values() if any(n == name for n, _ in s.adapter_key)]
        for seq in stale:
            self._drop(seq)
        for session, parked in list(self._parked.items()):
            if any(n == name for n, _ in parked.adapter_key):
                self._unpark(session)
        return len(stale)

    def reset(self) -> None:
        """Forget everything (the backend's memory was cleared)."""
        self._free = set(range(self._n_seq))
        self._busy.clear()
        self._sessions.clear()
        self._prefixes.clear()
        self._idle.clear()
        self._idle_cells = 0
        self._parked.clear()
        self.parked_bytes = 0

    # -- internals -----------------------------------------------------------------------------

    def _new_id(self, *, high: bool = False, adapter_key: AdapterKey = ()) -> int:
        """A sequence id for a session (next to the running ones of its adapter set) or for
        a prefix (`high`: the highest free).

        With a KV stream per sequence the backend evaluates only sequences of consecutive
        ids in one pass over the weights (`LlamaCppBackend.decode`): eight NPCs decoding at
        scattered ids take up to eight passes. Measured, the ids of a busy engine scatter
        within a few rounds of new NPCs and throughput fell by a quarter. So a session goes
        next to a running sequence of its adapter set: a free id there, else an idle entry
        there from the older half of the idle ones (evicted, so parked), else the lowest
        free id (not beside another set's running ones when it can), else the least recently
        used idle entry's. Prefixes, only ever copied, keep
        out of the way at the top."""
        if high:
            if not self._free:
                if not self._idle:
                    raise RuntimeError("every sequence is busy; the scheduler admitted too many")
                self._evict(next(iter(self._idle.values())))
            seq_id = max(self._free)
            self._free.discard(seq_id)
            return seq_id
        near = self._next_to(adapter_key)
        found = next((i for i in near if i in self._free), None)
        if found is None and near:
            older = list(self._idle)[: (len(self._idle) + 1) // 2]
            found = next((i for i in near if i in older), None)
            if found is not None:
                self._evict(self._idle[found])
        if found is not None:
            self.placed_near += 1
            seq_id = found
        elif self._free:
            # The first of its set: not beside another set's running sequences, which may
            # grow into the ids next to them.
            taken = {i + d for i, key in self._busy.items() if key != adapter_key for d in (-1, 1)}
            seq_id = min(self._free - taken, default=min(self._free))
        else:
            if not self._idle:
                raise RuntimeError("every sequence is busy; the scheduler admitted too many")
            seq_id = next(iter(self._idle))
            self._evict(self._idle[seq_id])
        self._free.discard(seq_id)
        return seq_id

    def _next_to(self, adapter_key: AdapterKey) -> list[int]:
        """Ids not in use beside the running sequences of `adapter_key`, lowest first."""
        mine = {i for i, key in self._busy.items() if key == adapter_key}
        near = {i + d for i in mine for d in (-1, 1)} - self._busy.keys()
        prefixes = {p.seq_id for p in self._prefixes}
        return sorted(i for i in near if 0 <= i < self._n_seq and i not in prefixes)

    def _evict(self, seq: CachedSequence) -> None:
        """Drop an idle entry to make room; a session's cells are parked first, when the
        backend can save them and they fit the budget."""
        if (
            seq.session is not None
            and self.park_bytes
            and len(seq.tokens) >= self.prefix_min_tokens
        ):
            data = self._backend.seq_save(seq.seq_id)
            if data is not None and len(data) <= self.park_bytes:
                self._unpark(seq.session)
                self._parked[seq.session] = Parked(seq.adapter_key, list(seq.tokens), data)
                self.parked_bytes += len(data)
                self.parks += 1
                while self.parked_bytes > self.park_bytes:
                    self._unpark(next(iter(self._parked)))
        self._drop(seq)

    def _unpark(self, session: SessionKey) -> Parked | None:
        parked = self._parked.pop(session, None)
        if parked is not None:
            self.parked_bytes -= len(parked.data)
        return parked

    def _make_idle(self, seq: CachedSequence) -> None:
        self._idle[seq.seq_id] = seq
        self._idle_cells += len(seq.tokens)

    def _unidle(self, seq: CachedSequence) -> None:
        if self._idle.pop(seq.seq_id, None) is not None:
            self._idle_cells -= len(seq.tokens)

    def _take(self, seq: CachedSequence) -> None:
        self._unidle(seq)
        seq.busy = True
        self._busy[seq.seq_id] = seq.adapter_key

    def _shift(self, seq: CachedSequence, prompt: list[int], cached: int, limit: int) -> int:
        """Where `prompt` leaves `seq`'s tokens at `cached` and goes on as they do further on
        (for `shift_min_tokens` at least), cut the stretch between out of `seq` (the later
        tokens move down to `cached`); returns the prompt tokens `seq` then holds."""
        run = self.shift_min_tokens
        held = seq.tokens
        if (
            not run
            or cached < seq.shared
            or cached >= limit
            or len(held) - cached <= run
            or len(prompt) - cached < run
        ):
            return cached
        want = prompt[cached : cached + run]
        first = want[0]
        for end in range(cached + 1, len(held) - run + 1):
            if held[end] == first and held[end : end + run] == want:
                break
        else:
            return cached
        if not self._backend.seq_cut(seq.seq_id, cached, end):
            return cached
        del held[cached:end]
        self.shifts += 1
        return min(cached + common_prefix(held[cached:], prompt[cached:]), limit)

    def _truncate(self, seq: CachedSequence, length: int) -> None:
        seq.shared = min(seq.shared, length)
        if length < len(seq.tokens):
            self._backend.seq_remove(seq.seq_id, length)
            del seq.tokens[length:]

    def _drop(self, seq: CachedSequence) -> None:
        self._unidle(seq)
        self._busy.pop(seq.seq_id, None)
        if seq.session is not None and self._sessions.get(seq.session) is seq:
            del self._sessions[seq.session]
        if seq.session is None and seq in self._prefixes:
            self._prefixes.remove(seq)
        self._backend.seq_remove(seq.seq_id, 0)
        seq.tokens.clear()
        self._free.add(seq.seq_id)
        self.evictions += 1
