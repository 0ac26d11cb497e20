"""Which sequence holds what: session reuse, shared prefixes, adapter isolation, eviction.

The backend here records sequence operations; the cache's decisions are under test.
"""

from __future__ import annotations

import pytest

from mythic.engine._kvcache import SequenceCache

pytestmark = pytest.mark.unit


class SeqRecorder:
    """The sequence operations a backend would perform, as lists of positions per sequence."""

    def __init__(self) -> None:
        self.cells: dict[int, int] = {}
        self.ops: list[tuple[str, int, int, int]] = []

    def seq_remove(self, seq_id: int, start: int = 0) -> None:
        self.ops.append(("rm", seq_id, start, -1))
        self.cells[seq_id] = min(self.cells.get(seq_id, 0), start)

    def seq_copy(self, src: int, dst: int, length: int) -> None:
        self.ops.append(("cp", src, dst, length))
        self.cells[dst] = length


PROMPT = list(range(100))
SYSTEM = 40


def cache(n_seq: int = 4) -> tuple[SequenceCache, SeqRecorder]:
    recorder = SeqRecorder()
    return SequenceCache(recorder, n_seq, prefix_min_tokens=8), recorder  # type: ignore[arg-type]


def evaluated(seq_cache: SequenceCache, got: object, tokens: list[int]) -> None:
    """What the engine does after evaluating a prompt: the sequence holds its tokens."""
    got.seq.tokens = list(tokens)  # type: ignore[attr-defined]


def test_a_follow_up_turn_reuses_its_session_up_to_the_common_prefix() -> None:
    c, rec = cache()
    first = c.acquire(("marla", "s"), (), PROMPT)
    assert (first.cached, first.source) == (0, "none")
    evaluated(c, first, [*PROMPT, 500, 501])
    c.release(first.seq)
    follow = [*PROMPT, 500, 777, 778]
    again = c.acquire(("marla", "s"), (), follow)
    assert again.seq is first.seq
    assert again.cached == 101
    assert ("rm", first.seq.seq_id, 101, -1) in rec.ops  # the diverging tail is dropped


def test_the_last_prompt_token_is_always_left_to_evaluate() -> None:
    c, _ = cache()
    first = c.acquire(("marla", "s"), (), PROMPT)
    evaluated(c, first, PROMPT)
    c.release(first.seq)
    assert c.acquire(("marla", "s"), (), PROMPT).cached == len(PROMPT) - 1


def test_a_shared_prefix_is_copied_into_new_sessions() -> None:
    c, rec = cache()
    a = c.acquire(("a", "s"), (), PROMPT)
    evaluated(c, a, PROMPT)
    assert c.share_prefix(a.seq, SYSTEM)
    assert not c.share_prefix(a.seq, SYSTEM)  # already cached
    other = [*PROMPT[:SYSTEM], 900, 901, 902]
    b = c.acquire(("b", "s"), (), other)
    assert (b.cached, b.source) == (SYSTEM, "prefix")
    assert rec.ops[-1][0] == "cp" and rec.ops[-1][2:] == (b.seq.seq_id, SYSTEM)


def test_a_busy_sequence_adopts_what_a_request_beside_it_evaluated() -> None:
    c, rec = cache()
    leader = c.acquire(("a", "s"), (), PROMPT)
    follower = c.acquire(("b", "s"), (), [*PROMPT[:SYSTEM], 900, 901])
    evaluated(c, leader, PROMPT[:60])  # part-way through its prompt
    c.adopt(follower.seq, leader.seq, SYSTEM)
    assert follower.seq.tokens == PROMPT[:SYSTEM]
    assert rec.ops[-2:] == [
        ("rm", follower.seq.seq_id, 0, -1),
        ("cp", leader.seq.seq_id, follower.seq.seq_id, SYSTEM),
    ]
    # Neither may shift the shared cells now.
    assert follower.seq.shared == SYSTEM and leader.seq.shared == SYSTEM
    with pytest.raises(ValueError, match="holds 60 tokens"):
        c.adopt(follower.seq, leader.seq, 61)


def test_kv_made_under_one_adapter_set_is_never_reused_under_another() -> None:
    c, _ = cache()
    vampire = (("vampire", 1.0),)
    a = c.acquire(("a", "s"), vampire, PROMPT)
    evaluated(c, a, PROMPT)
    c.share_prefix(a.seq, SYSTEM)
    c.release(a.seq)
    # Same session, other adapters: nothing reused, the old sequence is dropped.
    again = c.acquire(("a", "s"), (), PROMPT)
    assert again.cached == 0
    assert again.seq is not a.seq
    # A new session under the base model does not get the vampire prefix either.
    assert c.acquire(("b", "s"), (), PROMPT).cached == 0
    assert c.acquire(("c", "s"), vampire, PROMPT).source == "prefix"


def test_idle_sequences_are_evicted_least_recently_used_first() -> None:
    c, _ = cache(n_seq=3)
    seqs = []
    for name in ("a", "b", "c"):
        got = c.acquire((name, "s"), (), [ord(name), *PROMPT])
        evaluated(c, got, [ord(name), *PROMPT])
        c.release(got.seq)
        seqs.append(got.seq)
    # A fourth session needs a sequence: "a", the least recently used, goes.
    d = c.acquire(("d", "s"), (), PROMPT)
    assert d.seq.seq_id == seqs[0].seq_id
    assert c.acquire(("a", "s"), (), [ord("a"), *PROMPT]).cached == 0
    assert c.evictions >= 1


def test_new_sessions_go_next_to_the_running_ones_of_their_adapter_set() -> None:
    """The backend evaluates consecutive ids in one pass: a new NPC's sequence goes beside
    the running sequences of its adapter set (a free id there first, else an older idle
    entry there, evicted), and the first of a set keeps away from the others'."""
    c, _ = cache(n_seq=12)
    vamp = (("vampire", 1.0),)
    for i in range(6):  # idle sessions at 0-5
        got = c.acquire((f"old{i}", "s"), (), [i, *PROMPT])
        evaluated(c, got, [i, *PROMPT])
        c.release(got.seq)
    for i in range(4):  # old0-3 used again: old4 and old5 are now the older ones
        got = c.acquire((f"old{i}", "s"), (), [i, *PROMPT])
        c.release(got.seq)
    ids = {}
    for name, key in (("a", ()), ("v1", vamp), ("b", ()), ("v2", vamp), ("c", ())):
        ids[name] = c.acquire((name, "s"), key, [ord(name[0]), *PROMPT]).seq.seq_id
    assert ids == {"a": 6, "v1": 8, "b": 7, "v2": 9, "c": 5}
    assert c.placed_near == 3
    # c took the older idle neighbour (evicted); the recently used ones are still cached.
    assert c.acquire(("old3", "s"), (), [3, *PROMPT]).cached > 0
    assert c.acquire(("old5", "s"), (), [5, *PROMPT]).cached == 0


class ParkingRecorder(SeqRecorder):
    """A backend that saves a sequence as the bytes of its positions (one byte each)."""

    def seq_save(self, seq_id: int) -> bytes | None:
        return bytes(self.cells.get(seq_id, 0))

    def seq_restore(self, seq_id: int, data: bytes) -> bool:
        self.ops.append(("restore", seq_id, len(data), -1))
        self.cells[seq_id] = len(data)
        return True


def test_an_evicted_session_is_parked_and_loaded_back_for_its_next_turn() -> None:
    rec = ParkingRecorder()
    c = SequenceCache(rec, 2, prefix_min_tokens=8, park_bytes=150)  # type: ignore[arg-type]
    turns = {name: [ord(name), *PROMPT] for name in "abc"}
    for name in "abc":  # two sequences: "c" evicts "a", which is parked
        got = c.acquire((name, "s"), (), turns[name])
        evaluated(c, got, turns[name])
        rec.cells[got.seq.seq_id] = len(turns[name])
        c.release(got.seq)
    assert (c.parks, c.parked_bytes) == (1, 101)
    back = c.acquire(("a", "s"), (), [*turns["a"], 7, 8])  # the next turn: its own cells
    assert (back.source, back.cached, c.restores) == ("parked", 101, 1)
    assert back.seq.tokens == turns["a"]
    assert c.parked_bytes == 101  # "b" was evicted for it, and parked in turn
    # Over the budget, the least recently parked goes; another adapter set gets nothing.
    c.release(back.seq)
    c.acquire(("d", "s"), (), [ord("d"), *PROMPT])  # evicts "c": parked, "b" dropped
    assert c.parked_bytes <= 250
    b = c.acquire(("b", "s"), (), turns["b"])
    assert b.source == "none"
    c.release(b.seq)
    assert c.acquire(("c", "s"), (("vampire", 1.0),), turns["c"]).source == "none"


def test_eviction_by_cells_keeps_the_idle_total_under_the_budget() -> None:
    c, _ = cache(n_seq=8)
    for name in "abcd":
        got = c.acquire((name, "s"), (), PROMPT)
        evaluated(c, got, PROMPT)
        c.release(got.seq)
    assert c.idle_cells == 400
    c.evict(250)
    assert c.idle_cells <= 250
    assert c.num_idle == 2


def test_when_every_sequence_is_busy_acquire_refuses() -> None:
    c, _ = cache(n_seq=2)
    c.acquire(("a", "s"), (), PROMPT)
    c.acquire(("b", "s"), (), PROMPT)
    with pytest.raises(RuntimeError, match="busy"):
        c.acquire(("c", "s"), (), PROMPT)


def test_two_turns_of_one_session_at_once_leave_one_owner() -> None:
    c, _ = cache()
    one = c.acquire(("a", "s"), (), PROMPT)
    two = c.acquire(("a", "s"), (), PROMPT)  # the first is busy: a second sequence
    assert one.seq is not two.seq
    evaluated(c, one, PROMPT)
    evaluated(c, two, PROMPT)
    c.release(two.seq)
    c.release(one.seq)
    assert c.num_idle == 1
    assert c.acquire(("a", "s"), (), PROMPT).cached == len(PROMPT) - 1


def test_unloading_an_adapter_forgets_what_was_computed_under_it() -> None:
    c, _ = cache(n_seq=6)
    vamp = (("vampire", 1.0),)
    a = c.acquire(("a", "s"), vamp, PROMPT)
    evaluated(c, a, PROMPT)
    assert c.share_prefix(a.seq, SYSTEM)
    c.release(a.seq)
    b = c.acquire(("b", "s"), (), PROMPT)
    evaluated(c, b, PROMPT)
    c.release(b.seq)
    assert c.forget_adapter("vampire") == 2  # the session and its prefix
    assert c.forget_adapter("vampire") == 0
    # Loaded again under the same name: nothing is reused from before.
    assert c.acquire(("a", "s"), vamp, PROMPT).cached == 0
    assert c.acquire(("b", "s"), (), PROMPT).cached == len(PROMPT) - 1


class ShiftingRecorder(SeqRecorder):
    """A backend that can shift positions (llama.cpp's `seq_cut`); `refuse` one that cannot."""

    def __init__(self, *, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse

    def seq_cut(self, seq_id: int, start: int, end: int) -> bool:
        if self.refuse:
            return False
        self.ops.append(("cut", seq_id, start, end))
        self.cells[seq_id] = self.cells.get(seq_id, 0) - (end - start)
        return True


def shifting(*, refuse: bool = False, run: int = 8) -> tuple[SequenceCache, ShiftingRecorder]:
    recorder = ShiftingRecorder(refuse=refuse)
    c = SequenceCache(recorder, 4, prefix_min_tokens=8, shift_min_tokens=run)  # type: ignore[arg-type]
    return c, recorder


# A conversation: the persona (40), three exchanges of 20 tokens, then the last reply's end.
PERSONA = list(range(SYSTEM))
EXCHANGES = [list(range(1000 + 100 * i, 1020 + 100 * i)) for i in range(3)]
HELD = [*PERSONA, *EXCHANGES[0], *EXCHANGES[1], *EXCHANGES[2]]


def test_a_window_past_the_oldest_exchange_keeps_the_later_ones_shifted() -> None:
    """The prompt leaves out the first exchange: the cache cuts it out of the session's
    sequence and the later exchanges, moved down, count as cached; only the new line is left
    to evaluate."""
    c, rec = shifting()
    first = c.acquire(("marla", "s"), (), HELD)
    evaluated(c, first, HELD)
    c.release(first.seq)
    line = [7000, 7001, 7002]
    moved = [*PERSONA, *EXCHANGES[1], *EXCHANGES[2], *line]
    again = c.acquire(("marla", "s"), (), moved)
    assert again.seq is first.seq
    assert ("cut", first.seq.seq_id, SYSTEM, SYSTEM + 20) in rec.ops
    assert again.cached == len(moved) - len(line)
    assert again.seq.tokens == moved[: again.cached]
    assert c.shifts == 1


def test_no_shift_without_a_long_enough_run_or_a_backend_that_can() -> None:
    """A prompt that matches the later tokens for fewer than `shift_min_tokens` (here a
    line that only shares a few tokens with an old exchange), a backend that cannot shift,
    and a stretch inside cells shared with a prefix all evaluate again from the divergence."""
    line = [7000, 7001, 7002]
    moved = [*PERSONA, *EXCHANGES[1], *EXCHANGES[2], *line]
    for c, rec in (shifting(run=64), shifting(refuse=True)):
        first = c.acquire(("marla", "s"), (), HELD)
        evaluated(c, first, HELD)
        c.release(first.seq)
        again = c.acquire(("marla", "s"), (), moved)
        assert again.cached == SYSTEM and again.seq.tokens == PERSONA
        assert not any(op[0] == "cut" for op in rec.ops) and c.shifts == 0
    # Cells shared with a persona prefix copied in: never shifted.
    c, rec = shifting()
    first = c.acquire(("marla", "s"), (), HELD)
    evaluated(c, first, HELD)
    c.share_prefix(first.seq, SYSTEM + 10)
    c.release(first.seq)
    again = c.acquire(("marla", "s"), (), moved)
    assert again.cached == SYSTEM and c.shifts == 0
