"""The token scheduler, driven step by step without a model."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from mythic.engine import (
    EngineTrace,
    Overloaded,
    Priority,
    ScheduledEntry,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)

pytestmark = pytest.mark.unit

_ids = itertools.count()


def entry(
    priority: Priority = Priority.SILVER,
    *,
    prompt: int = 1,
    max_tokens: int = 100,
    arrival: float = 0.0,
    deadline: float | None = None,
    adapters: tuple[tuple[str, float], ...] = (),
    name: str | None = None,
) -> ScheduledEntry:
    return ScheduledEntry(
        request_id=name or f"r{next(_ids)}",
        priority=priority,
        arrival=arrival,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        kv_cells=prompt + max_tokens,
        adapter_key=adapters,
        deadline=deadline,
    )


def step(sched: Scheduler, now: float = 0.0, seconds: float = 0.01) -> SchedulerOutput:
    out = sched.schedule(now)
    sched.update(out, finished=(), step_seconds=seconds)
    return out


def tokens_by_request(out: SchedulerOutput) -> dict[str, int]:
    return {chunk.request_id: chunk.n_tokens for chunk in out.chunks()}


def test_new_request_is_admitted_and_prefilled_then_decodes_one_token_per_step() -> None:
    sched = Scheduler()
    e = entry(prompt=10)
    sched.add(e)
    out = step(sched)
    assert out.admitted == [e.request_id]
    [chunk] = out.chunks()
    assert (chunk.n_tokens, chunk.prefill, chunk.sample) == (10, True, True)
    [chunk] = step(sched).chunks()
    assert (chunk.n_tokens, chunk.prefill, chunk.sample) == (1, False, True)
    assert e.generated == 2


def test_a_held_request_is_admitted_but_not_scheduled_until_released() -> None:
    sched = Scheduler()
    leader, follower = entry(prompt=100), entry(prompt=100)
    sched.add(leader)
    sched.add(follower)
    follower.held = True  # the engine's `_follow`: it waits for the leader's cells
    out = step(sched)
    assert out.admitted == [leader.request_id, follower.request_id]
    assert set(tokens_by_request(out)) == {leader.request_id}
    follower.held, follower.prompt_tokens = False, 40  # the engine copied 60 tokens
    out = step(sched)
    assert tokens_by_request(out)[follower.request_id] == 40


def test_prompts_fill_the_step_oldest_first_until_somebody_streams() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=512, prefill_chunk=64))
    first, second = entry(prompt=400, arrival=0.0), entry(prompt=400, arrival=1.0)
    third = entry(prompt=400, arrival=2.0)
    sched.add(second)
    sched.add(first)
    # Nobody streams: the oldest prompt takes all it needs, the next one the rest.
    assert tokens_by_request(step(sched)) == {first.request_id: 400, second.request_id: 112}
    sched.add(third)
    # Now the first streams: the others get `prefill_chunk` tokens a step each, together,
    # the older one first.
    assert tokens_by_request(step(sched)) == {first.request_id: 1, second.request_id: 128}


def test_a_request_with_its_own_step_cap_evaluates_no_more_per_step_even_alone() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_tokens=512, prefill_chunk=64))
    warm_up = entry(prompt=40)
    warm_up.step_tokens = 16  # a prefill a line may stop: short steps bound the line's wait
    other = entry(prompt=100, arrival=1.0)
    sched.add(warm_up)
    sched.add(other)
    # Alone in the step the warm-up would take all 40; capped, the rest goes to the other.
    assert tokens_by_request(step(sched)) == {warm_up.request_id: 16, other.request_id: 100}
    assert tokens_by_request(step(sched))[warm_up.request_id] == 16
    out = step(sched)
    assert tokens_by_request(out)[warm_up.request_id] == 8
    assert [c.sample for c in out.chunks() if c.request_id == warm_up.request_id] == [True]


def test_gold_is_scheduled_first_and_always_when_sequences_are_scarce() -> None:
    sched = Scheduler(SchedulerConfig(max_batch_seqs=4, min_slice_seqs=0))
    silver = [entry(Priority.SILVER) for _ in range(8)]
    for e in silver:
        sched.add(e)
    step(sched)
    gold = entry(Priority.GOLD, arrival=1.0)
    sched.add(gold)
    for _ in range(5):
        out = step(sched)
        first = next(iter(out.chunks()))
        assert first.request_id == gold.request_id
        assert out.num_seqs == 4


def test_fair_share_follows_class_weights_among_competing_sequences() -> None:
    cfg = SchedulerConfig(max_batch_seqs=3, min_slice_seqs=0, burst_tokens=1, kv_capacity=100_000)
    sched = Scheduler(cfg)
    entries = [entry(Priority.SPEAKING, max_tokens=1000, prompt=1) for _ in range(3)]
    entries += [entry(Priority.BRONZE, max_tokens=1000, prompt=1) for _ in range(3)]
    for e in entries:
        sched.add(e)
    served: Counter[Priority] = Counter()
    for _ in range(450):
        for chunk in step(sched).chunks():
            served[sched.get(chunk.request_id).priority] += 1  # type: ignore[union-attr]
    ratio = served[Priority.SPEAKING] / served[Priority.BRONZE]
    assert ratio == pytest.approx(8.0, rel=0.15)


def test_minimum_slice_keeps_every_class_moving() -> None:
    cfg = SchedulerConfig(max_batch_seqs=4, min_slice_seqs=1, kv_capacity=100_000)
    sched = Scheduler(cfg)
    for _ in range(10):
        sched.add(entry(Priority.SPEAKING, max_tokens=1000))
    bronze = entry(Priority.BRONZE, max_tokens=1000)
    idle = entry(Priority.IDLE, max_tokens=1000)
    sched.add(bronze)
    sched.add(idle)
    for _ in range(50):
        ids = tokens_by_request(step(sched))
        assert bronze.request_id in ids
        assert idle.request_id in ids
    assert bronze.generated == 50


def test_burst_keeps_a_slot_then_yields_it() -> None:
    cfg = SchedulerConfig(max_batch_seqs=1, min_slice_seqs=0, burst_tokens=5, kv_capacity=100_000)
    sched = Scheduler(cfg)
    a, b = entry(name="a", max_tokens=1000), entry(name="b", max_tokens=1000)
    sched.add(a)
    sched.add(b)
    order = ["".join(tokens_by_request(step(sched))) for _ in range(20)]
    # Runs of exactly burst_tokens steps alternate between the two.
    runs = [len(list(group)) for _, group in itertools.groupby(order)]
    assert runs[1:-1] == [5] * len(runs[1:-1])
    assert set(order) == {"a", "b"}


def test_long_prompt_is_chunked_and_other_streams_keep_decoding() -> None:
    cfg = SchedulerConfig(prefill_chunk=64, max_batch_tokens=256)
    sched = Scheduler(cfg)
    talking = entry(Priority.SILVER, prompt=4)
    sched.add(talking)
    step(sched)
    long = entry(Priority.SILVER, prompt=1000)
    sched.add(long)
    steps = 0
    while not long.decoding:
        out = tokens_by_request(step(sched))
        steps += 1
        assert out[talking.request_id] == 1
        assert out[long.request_id] <= 64
    assert steps == 16  # ceil(1000 / 64)


def test_a_players_prompt_is_not_chunked_for_less_urgent_streams_beside_it() -> None:
    # A scene's ambient chatter (silver, bronze) streams; a player's line (speaking) arrives:
    # its prompt takes the step as if nobody streamed, and the chatter still advances.
    cfg = SchedulerConfig(prefill_chunk=64, max_batch_tokens=512)
    sched = Scheduler(cfg)
    chatter = [entry(Priority.SILVER, prompt=4), entry(Priority.BRONZE, prompt=4)]
    for e in chatter:
        sched.add(e)
    step(sched)
    line = entry(Priority.SPEAKING, prompt=400)
    sched.add(line)
    out = tokens_by_request(step(sched))
    assert out[line.request_id] == 400 and line.decoding
    assert all(out[e.request_id] == 1 for e in chatter)
    # A stream of the player's own class still keeps the prompt to its chunk.
    other = entry(Priority.SPEAKING, prompt=4)
    sched.add(other)
    step(sched)
    second = entry(Priority.SPEAKING, prompt=400)
    sched.add(second)
    assert tokens_by_request(step(sched))[second.request_id] == 64


def test_gold_prompt_is_not_held_to_the_silver_chunk() -> None:
    sched = Scheduler(SchedulerConfig(prefill_chunk=16, max_batch_tokens=256))
    gold = entry(Priority.GOLD, prompt=200)
    sched.add(gold)
    [chunk] = step(sched).chunks()
    assert chunk.n_tokens == 200
    assert chunk.sample


def test_a_step_with_gold_evaluates_few_other_prompt_tokens_and_every_other_decode() -> None:
    cfg = SchedulerConfig(prefill_chunk=64, max_batch_tokens=512, prefill_beside_gold=16)
    sched = Scheduler(cfg)
    talking = entry(Priority.SILVER, prompt=4)
    sched.add(talking)
    step(sched)
    prompts = [entry(Priority.SILVER, prompt=600) for _ in range(3)]
    for e in prompts:
        sched.add(e)
    out = tokens_by_request(step(sched))
    # No gold: a chunk's worth each, all together (taken by the first in line).
    assert sum(out.get(e.request_id, 0) for e in prompts) == 3 * 64
    gold = entry(Priority.GOLD, prompt=8, max_tokens=6)
    sched.add(gold)
    for n in range(6):  # the gold prompt in one step, then a token a step
        out = sched.schedule(0.0)
        tokens = tokens_by_request(out)
        assert tokens[gold.request_id] == (8 if n == 0 else 1)
        assert tokens[talking.request_id] == 1  # decodes are not held back
        assert sum(tokens.get(e.request_id, 0) for e in prompts) == 16
        sched.update(out, finished=[gold.request_id] if n == 5 else (), step_seconds=0.01)
    out = tokens_by_request(step(sched))
    assert sum(out.get(e.request_id, 0) for e in prompts) == 192  # gold gone: whole chunks


def test_token_budget_bounds_every_step() -> None:
    cfg = SchedulerConfig(prefill_chunk=100, max_batch_tokens=128)
    sched = Scheduler(cfg)
    for _ in range(5):
        sched.add(entry(prompt=300))
    for _ in range(20):
        assert step(sched).num_tokens <= 128


def test_deadline_already_passed_expires_without_running() -> None:
    sched = Scheduler()
    gold = entry(Priority.GOLD, deadline=1.0)
    sched.add(gold)
    out = sched.schedule(now=2.0)
    assert out.expired == [gold.request_id]
    assert out.num_tokens == 0
    assert not sched.has_work


def test_deadline_that_cannot_be_met_fails_fast_from_measured_speed() -> None:
    sched = Scheduler()
    warm = entry(prompt=100, max_tokens=1)
    sched.add(warm)
    out = sched.schedule(0.0)
    sched.update(out, finished=[warm.request_id], step_seconds=1.0)  # 10 ms per token
    # 500 prompt tokens need about 5 s; the deadline is 1 s away: fail now, not in 1 s.
    gold = entry(Priority.GOLD, prompt=500, deadline=11.0)
    sched.add(gold)
    assert sched.schedule(now=10.0).expired == [gold.request_id]
    # A short prompt with the same deadline runs.
    quick = entry(Priority.GOLD, prompt=20, deadline=11.0)
    sched.add(quick)
    out = sched.schedule(now=10.0)
    assert out.expired == []
    assert quick.request_id in tokens_by_request(out)


def test_deadline_passing_mid_generation_expires_the_running_request() -> None:
    sched = Scheduler()
    gold = entry(Priority.GOLD, deadline=5.0)
    sched.add(gold)
    step(sched, now=0.0)
    step(sched, now=1.0)
    assert sched.schedule(now=5.5).expired == [gold.request_id]


def test_waiting_queue_is_bounded_with_overloaded() -> None:
    cfg = SchedulerConfig(max_waiting=3)
    sched = Scheduler(cfg)
    for _ in range(3):
        sched.add(entry())
    with pytest.raises(Overloaded) as info:
        sched.add(entry())
    assert info.value.retryable
    step(sched)  # admission frees the queue
    sched.add(entry())


def test_admission_respects_kv_budget_and_keeps_a_reserve_for_gold() -> None:
    cfg = SchedulerConfig(kv_capacity=1000, gold_kv_reserve=200)
    sched = Scheduler(cfg)
    a = entry(prompt=100, max_tokens=300)  # 400 cells
    b = entry(prompt=100, max_tokens=300)  # 400: would reach 800 = limit for non-gold
    c = entry(prompt=100, max_tokens=300)
    for e in (a, b, c):
        sched.add(e)
    out = step(sched)
    assert out.admitted == [a.request_id, b.request_id]
    assert sched.kv_reserved == 800
    gold = entry(Priority.GOLD, prompt=50, max_tokens=100)
    sched.add(gold)
    assert step(sched).admitted == [gold.request_id]
    sched.remove(a.request_id)
    assert step(sched).admitted == []  # 400 + 150 gold + 400 would pass the non-gold limit
    sched.remove(gold.request_id)
    assert step(sched).admitted == [c.request_id]


def test_blocked_higher_class_is_not_overtaken_by_smaller_lower_class_requests() -> None:
    cfg = SchedulerConfig(kv_capacity=1000, gold_kv_reserve=100)
    sched = Scheduler(cfg)
    sched.add(entry(Priority.SILVER, prompt=100, max_tokens=500))  # 600 running
    step(sched)
    big = entry(Priority.SPEAKING, prompt=100, max_tokens=300)  # 400: does not fit
    small = entry(Priority.BRONZE, prompt=10, max_tokens=10)  # would fit
    sched.add(big)
    sched.add(small)
    assert step(sched).admitted == []


def test_request_that_can_never_fit_is_refused_at_add() -> None:
    sched = Scheduler(SchedulerConfig(kv_capacity=1000, gold_kv_reserve=100))
    with pytest.raises(ValueError, match="KV cells"):
        sched.add(entry(prompt=900, max_tokens=100))


def test_sequences_are_grouped_by_adapter_set_with_gold_in_its_own_group_first() -> None:
    sched = Scheduler(SchedulerConfig(adapter_quantum=0))  # every set every step
    vamp = (("vampire", 1.0),)
    wolf = (("werewolf", 0.5),)
    sched.add(entry(Priority.SILVER, adapters=vamp))
    sched.add(entry(Priority.SILVER, adapters=wolf))
    sched.add(entry(Priority.SILVER, adapters=vamp))
    sched.add(entry(Priority.SILVER))
    sched.add(entry(Priority.GOLD, adapters=wolf))
    out = step(sched)
    assert out.batches[0].gold
    assert out.batches[0].adapter_key == wolf
    assert [b.gold for b in out.batches[1:]] == [False, False, False]
    sizes = {batch.adapter_key: len(batch.chunks) for batch in out.batches[1:]}
    assert sizes == {wolf: 1, vamp: 2, (): 1}


def test_adapter_sets_take_turns_of_a_quantum_and_share_service_by_weight() -> None:
    """One set per step (llama.cpp re-plans its graph at each change of set); each set keeps
    the batch for `adapter_quantum` steps, then the least served set goes; gold runs every
    step in its own call whatever its set; over many steps each set gets its share."""
    sched = Scheduler(SchedulerConfig(adapter_quantum=4))
    vamp, wolf, lich = (("vampire", 1.0),), (("werewolf", 1.0),), (("lich", 1.0),)
    keys = {}
    for i, key in enumerate([vamp, vamp, wolf, wolf, lich]):
        e = entry(Priority.SILVER, adapters=key, max_tokens=500, arrival=i)
        keys[e.request_id] = key
        sched.add(e)
    turns: list[tuple[tuple[str, float], ...]] = []
    served: Counter[tuple[tuple[str, float], ...]] = Counter()
    for n in range(60):
        if n == 30:
            gold = entry(Priority.GOLD, adapters=lich, max_tokens=5)
            sched.add(gold)
        out = step(sched)
        silver = [b for b in out.batches if not b.gold]
        assert len(silver) == 1  # one adapter set a step
        turns.append(silver[0].adapter_key)  # type: ignore[arg-type]
        for chunk in silver[0].chunks:
            served[keys[chunk.request_id]] += chunk.n_tokens
        if 30 <= n < 35:
            assert out.batches[0].gold and out.batches[0].adapter_key == lich
    # Runs of 4 steps, the sets in turn (after the first prompts).
    runs = [len(list(group)) for _, group in itertools.groupby(turns)]
    assert all(r <= 4 for r in runs) and sum(r == 4 for r in runs) >= len(runs) - 2
    assert set(turns[:12]) == {vamp, wolf, lich}
    # Each sequence gets about the same tokens: a set of two gets about twice a set of one.
    assert served[vamp] == pytest.approx(2 * served[lich], rel=0.25)
    assert served[wolf] == pytest.approx(served[vamp], rel=0.25)


def test_a_set_whose_work_ends_hands_over_at_once_and_one_set_runs_every_step() -> None:
    sched = Scheduler(SchedulerConfig(adapter_quantum=8))
    vamp, wolf = (("vampire", 1.0),), (("werewolf", 1.0),)
    short = entry(Priority.SILVER, adapters=vamp, max_tokens=2)
    sched.add(short)
    long = entry(Priority.SILVER, adapters=wolf, max_tokens=100)
    sched.add(long)
    seen = []
    for _ in range(6):
        seen.append(set(tokens_by_request(step(sched))))
        if short.generated >= 2 and sched.get(short.request_id) is not None:
            sched.remove(short.request_id)  # done: the engine removes a finished request
    # The short one finishes within its turn; the other set then runs every step.
    assert seen[-3:] == [{long.request_id}] * 3


def test_a_set_with_a_more_urgent_npc_takes_the_turn_at_once() -> None:
    sched = Scheduler(SchedulerConfig(adapter_quantum=16))
    vamp, wolf = (("vampire", 1.0),), (("werewolf", 1.0),)
    for _ in range(2):
        sched.add(entry(Priority.SILVER, adapters=vamp))
    step(sched)
    step(sched)
    on_screen = entry(Priority.SPEAKING, adapters=wolf, prompt=5)
    sched.add(on_screen)
    out = step(sched)
    assert [b.adapter_key for b in out.batches] == [wolf]
    assert tokens_by_request(out) == {on_screen.request_id: 5}
    # Its set keeps the turn for a quantum, then the others get theirs: no starvation.
    turns = [step(sched).batches[0].adapter_key for _ in range(60)]
    assert turns[:15] == [wolf] * 15
    assert turns.count(vamp) >= 12


def test_a_mixed_adapter_backend_gets_one_call_per_class_and_each_chunk_its_set() -> None:
    sched = Scheduler(SchedulerConfig(mixed_adapters=True))
    vamp = (("vampire", 1.0),)
    wolf = (("werewolf", 0.5),)
    entries = [entry(Priority.SILVER, adapters=a) for a in (vamp, wolf, vamp, ())]
    gold = entry(Priority.GOLD, adapters=wolf)
    for e in [*entries, gold]:
        sched.add(e)
    out = step(sched)
    assert [(b.gold, b.adapter_key) for b in out.batches] == [(True, None), (False, None)]
    keys = {c.request_id: c.adapter_key for b in out.batches for c in b.chunks}
    assert keys == {e.request_id: e.adapter_key for e in [*entries, gold]}


def test_finished_and_removed_requests_release_their_reservation() -> None:
    sched = Scheduler()
    a, b = entry(), entry()
    sched.add(a)
    sched.add(b)
    out = sched.schedule(0.0)
    sched.update(out, finished=[a.request_id], step_seconds=0.01)
    assert sched.kv_reserved == b.kv_cells
    assert sched.remove(b.request_id) is b
    assert sched.kv_reserved == 0
    assert not sched.has_work
    assert sched.remove("unknown") is None


def test_duplicate_request_id_is_refused() -> None:
    sched = Scheduler()
    sched.add(entry(name="same"))
    with pytest.raises(ValueError, match="already"):
        sched.add(entry(name="same"))


def test_late_arrival_does_not_get_a_backlog_of_credit() -> None:
    cfg = SchedulerConfig(max_batch_seqs=1, min_slice_seqs=0, burst_tokens=1, kv_capacity=100_000)
    sched = Scheduler(cfg)
    old = entry(name="old", max_tokens=1000)
    sched.add(old)
    for _ in range(100):
        step(sched)
    new = entry(name="new", max_tokens=1000)
    sched.add(new)
    served = Counter("".join(tokens_by_request(step(sched))) for _ in range(40))
    assert served["old"] == pytest.approx(20, abs=2)


def test_max_seq_chunk_caps_every_prompt_chunk_gold_included() -> None:
    cfg = SchedulerConfig(
        prefill_chunk=64, max_batch_tokens=512, max_seq_chunk=48, prefill_beside_gold=512
    )
    sched = Scheduler(cfg)
    gold = entry(Priority.GOLD, prompt=100)
    silver = entry(Priority.SILVER, prompt=100)
    sched.add(gold)
    sched.add(silver)
    sizes = tokens_by_request(step(sched))
    assert sizes == {gold.request_id: 48, silver.request_id: 48}
    sizes = tokens_by_request(step(sched))
    assert sizes == {gold.request_id: 48, silver.request_id: 48}
    assert tokens_by_request(step(sched))[gold.request_id] == 4


def _traced(trace: EngineTrace, sched: Scheduler, index: int) -> SchedulerOutput:
    out = sched.schedule(0.0)
    sched.update(out, finished=(), step_seconds=0.01)
    priorities = {c.request_id: sched.get(c.request_id).priority for c in out.chunks()}  # type: ignore[union-attr]
    trace.ran(trace.begin() if index < 0 else index, out, priorities)
    return out


def test_the_trace_counts_the_steps_a_request_was_held_back() -> None:
    # Alone, a 1000-token prompt at 256 a step takes 4 steps: 0 behind. Arriving one step
    # late for a waiting slot, it is 1 behind; chunked to 64 beside a stream of its class,
    # 16 steps: 12 behind.
    cfg = SchedulerConfig(prefill_chunk=64, max_batch_tokens=256)
    trace = EngineTrace(1000, step_cap=256)
    sched = Scheduler(cfg)
    alone = entry(Priority.SPEAKING, prompt=1000, name="alone")
    sched.add(alone)
    trace.arrived("alone", "marla", "s", Priority.SPEAKING)
    while not alone.decoding:
        _traced(trace, sched, -1)
    assert trace.steps_behind("alone") == 0 and trace.shared_with("alone", {Priority.BRONZE}) == 0
    sched.remove("alone")

    trace = EngineTrace(1000, step_cap=256)
    sched = Scheduler(cfg)
    stream = entry(Priority.SPEAKING, prompt=4, name="stream")
    sched.add(stream)
    _traced(trace, sched, -1)
    trace.arrived("crowded", "bran", "s", Priority.SPEAKING)
    crowded = entry(Priority.SPEAKING, prompt=1000, name="crowded")
    sched.add(crowded)
    while not crowded.decoding:
        _traced(trace, sched, -1)
    assert trace.steps_behind("crowded") == 12
    assert trace.first_token_step("crowded") == 16
    assert trace.steps_behind("nobody") is None
