"""Intent sources off the frame path: the fetch pool's queue, and the client in a child process.

The child runs real fetch callables (tests/unit/intent_fetchers.py) through the same pool as
`AsyncIntentSource`; every wait is bounded by an event or a timeout, nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading

import pytest

from mythic.contracts import IntentRequest, IntentUpdate
from mythic.control import (
    AsyncIntentSource,
    Controller,
    CoreSplit,
    Placement,
    Player,
    ProcessIntentSource,
    QueuedTooLongError,
    Tier,
    ordinary_thread,
    realtime_thread,
    split_cores,
)
from tests.unit import intent_fetchers

pytestmark = pytest.mark.unit

DT = 1 / 60
ORIGIN = Player((0.0, 0.0))


class Collector:
    """A thread-safe sink that records what arrives and wakes the test; with `source`, it
    polls that source for answers while it waits, as a frame loop would."""

    def __init__(self) -> None:
        self.source: ProcessIntentSource | None = None
        self.lock = threading.Lock()
        self.updates: list[IntentUpdate] = []
        self.failures: list[tuple[IntentRequest, BaseException | None]] = []
        self.changed = threading.Condition(self.lock)

    def deliver(self, update: IntentUpdate) -> None:
        with self.changed:
            self.updates.append(update)
            self.changed.notify_all()

    def fail(self, request: IntentRequest, error: BaseException | None = None) -> None:
        with self.changed:
            self.failures.append((request, error))
            self.changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> None:
        def arrived() -> bool:
            return len(self.updates) + len(self.failures) >= count

        with self.changed:
            if self.source is None:
                ok = self.changed.wait_for(arrived, timeout_s)
            else:
                ok = False
                for _ in range(int(timeout_s / 0.005)):  # a frame loop's polls, bounded
                    self.changed.release()
                    try:
                        self.source.poll()
                    finally:
                        self.changed.acquire()
                    if ok := arrived():
                        break
                    self.changed.wait(0.005)
        assert ok, f"only {self.updates} and {self.failures} arrived"

    def failure_of(self, npc_id: str) -> BaseException | None:
        return next(e for r, e in self.failures if r.npc_id == npc_id)


def started(
    connect: object, sink: Collector, answers: str, **kwargs: object
) -> ProcessIntentSource:
    """A started source handing answers to `sink` by `answers` ("poll": the sink polls)."""
    source = ProcessIntentSource(connect, answers=answers, **kwargs)  # type: ignore[arg-type]
    source.start(sink)
    if answers == "poll":
        sink.source = source
    return source


ANSWERS = pytest.mark.parametrize("answers", ["poll", "thread"])


def ask(npc_id: str, n: int = 1) -> IntentRequest:
    return IntentRequest(npc_id=npc_id, request_id=f"r-{npc_id}-{n}")


# -- the queue drops what the controller gave up on -------------------------------------------


def test_a_request_queued_past_max_wait_fails_without_being_fetched() -> None:
    fetched: list[str] = []
    gate: dict[str, asyncio.Event] = {}
    started = threading.Event()

    async def fetch(request: IntentRequest) -> IntentUpdate:
        fetched.append(request.npc_id)
        if request.npc_id == "first":
            gate["open"] = asyncio.Event()
            started.set()
            await gate["open"].wait()  # holds the only worker
        return IntentUpdate(npc_id=request.npc_id, intent="hint", request_id=request.request_id)

    sink = Collector()
    with AsyncIntentSource(fetch, max_concurrency=1, max_wait_s=0.05) as source:
        source.start(sink)
        source.submit(ask("first"), Tier.GOLD)
        assert started.wait(5)
        source.submit(ask("late"), Tier.GOLD)
        threading.Event().wait(0.2)  # longer than max_wait_s while the worker is busy
        source.loop.call_soon_threadsafe(gate["open"].set)
        sink.wait_for(2)
        assert source.expired_in_queue == 1
    assert fetched == ["first"]
    assert [u.npc_id for u in sink.updates] == ["first"]
    assert isinstance(sink.failure_of("late"), QueuedTooLongError)


def test_max_wait_and_concurrency_are_checked() -> None:
    async def fetch(request: IntentRequest) -> IntentUpdate:
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="max_wait_s"):
        AsyncIntentSource(fetch, max_wait_s=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        ProcessIntentSource(intent_fetchers.answering, max_concurrency=0)
    with pytest.raises(ValueError, match="nice"):
        ProcessIntentSource(intent_fetchers.answering, nice=40)


# -- the client in a child process ------------------------------------------------------------


@ANSWERS
def test_process_source_fetches_in_another_process_and_feeds_the_controller(answers: str) -> None:
    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    sink = Collector()
    source = started(functools.partial(intent_fetchers.answering, "quest"), sink, answers)
    try:
        assert source.running and source.pid not in (None, os.getpid())
        source.submit(ask("pid"), Tier.GOLD)
        source.submit(ask("marla"), Tier.GOLD)
        sink.wait_for(2)
    finally:
        source.close()
    assert not source.running
    by_npc = {u.npc_id: u for u in sink.updates}
    assert by_npc["pid"].bark == f"pid {source.pid}"  # answered by the child
    assert by_npc["marla"].request_id == "r-marla-1"  # re-stamped with the request it answers
    for update in sink.updates:  # what a controller gets is an ordinary update
        controller.deliver(update)
    controller.frame(DT, 0.0, ORIGIN)
    assert controller.stats().unknown_npc == 1  # "pid" is not in the crowd
    intent = controller.intent_of("marla")
    assert intent is None  # not the request in flight for marla: dropped as stale
    assert controller.stats().dropped_stale == 1


@ANSWERS
def test_process_source_round_trip_through_the_controller(answers: str) -> None:
    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    source = ProcessIntentSource(intent_fetchers.answering, answers=answers)  # type: ignore[arg-type]
    source.start(controller)
    controller.source = source
    try:
        controller.request_now("marla")
        controller.frame(DT, 0.0, ORIGIN)  # submits
        now = DT
        for _ in range(3000):  # frames until the answer lands (bounded)
            controller.frame(DT, now, ORIGIN)
            now += DT
            if controller.intent_of("marla") is not None:
                break
            threading.Event().wait(0.005)
    finally:
        source.close()
    intent = controller.intent_of("marla")
    assert intent is not None and intent.intent == "trade"
    assert controller.stats().applied == 1


@ANSWERS
def test_process_source_passes_failures_back_typed_or_named(answers: str) -> None:
    sink = Collector()
    with started(intent_fetchers.answering, sink, answers) as source:
        source.submit(ask("broken"), Tier.GOLD)
        source.submit(ask("odd"), Tier.SILVER)
        sink.wait_for(2)
    broken = sink.failure_of("broken")
    assert isinstance(broken, ValueError) and "model down" in str(broken)
    odd = sink.failure_of("odd")  # cannot be pickled: named in a RuntimeError instead
    assert isinstance(odd, RuntimeError) and "UnpicklableError: odd failure" in str(odd)


def test_a_child_that_cannot_connect_raises_at_start() -> None:
    source = ProcessIntentSource(intent_fetchers.refusing)
    with pytest.raises(ConnectionError, match="no server at"):
        source.start(Collector())
    assert not source.running
    source.close()  # still fine


@ANSWERS
def test_close_fails_the_requests_still_running(answers: str) -> None:
    sink = Collector()
    source = started(intent_fetchers.answering, sink, answers)
    source.submit(ask("slow"), Tier.GOLD)
    source.close()
    sink.wait_for(1)
    assert isinstance(sink.failure_of("slow"), ConnectionError)
    source.submit(ask("marla"), Tier.GOLD)  # after close: fails at once
    sink.wait_for(2)
    assert isinstance(sink.failure_of("marla"), ConnectionError)


@ANSWERS
def test_a_dead_child_fails_its_requests_and_the_game_goes_on(answers: str) -> None:
    controller = Controller()
    controller.add("marla", "barkeep", (5.0, 0.0))
    sink = Collector()
    source = started(intent_fetchers.answering, sink, answers)
    try:
        source.submit(ask("slow"), Tier.GOLD)
        pid = source.pid
        assert pid is not None
        os.kill(pid, 9)
        sink.wait_for(1)
        assert isinstance(sink.failure_of("slow"), ConnectionError)
        assert not source.running
        source.submit(ask("marla"), Tier.GOLD)
        sink.wait_for(2)
        assert isinstance(sink.failure_of("marla"), ConnectionError)
        controller.frame(DT, 0.0, ORIGIN)  # the frame path is untouched
    finally:
        source.close()


# -- where the model's processes run ----------------------------------------------------------


def test_split_cores_keeps_at_least_one_core_for_the_game() -> None:
    assert split_cores(1, [0, 1]) == CoreSplit(game=frozenset({0}), model=frozenset({1}))
    assert split_cores(3, [4, 5, 6, 7]) == CoreSplit(frozenset({4}), frozenset({5, 6, 7}))
    assert split_cores(8, [0, 1, 2]) == CoreSplit(frozenset({0}), frozenset({1, 2}))
    assert split_cores(2, range(16)) == CoreSplit(frozenset(range(14)), frozenset({14, 15}))
    assert split_cores(1, [3]) is None  # one core: nothing to split
    with pytest.raises(ValueError, match="at least 1"):
        split_cores(0, [0, 1])


def _policy() -> int:
    return os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="no POSIX scheduling here")
def test_a_realtime_frame_loop_thread_starts_ordinary_threads_and_goes_back() -> None:
    """Run in a thread of its own: the test's thread keeps its policy whatever happens."""
    seen: dict[str, object] = {}

    def frame_loop() -> None:
        seen["before"] = _policy()
        seen["granted"] = granted = realtime_thread(2)
        seen["during"] = _policy()
        seen["priority"] = os.sched_getparam(0).sched_priority
        child = threading.Thread(target=lambda: seen.setdefault("child", _policy()))
        child.start()
        child.join(5)
        seen["back"] = ordinary_thread() if granted else None
        seen["after"] = _policy()

    loop = threading.Thread(target=frame_loop)
    loop.start()
    loop.join(5)
    assert seen["before"] == os.SCHED_OTHER
    if seen["granted"]:  # root, or an rtprio limit
        assert seen["during"] == os.SCHED_FIFO and seen["priority"] == 2
        assert seen["child"] == os.SCHED_OTHER  # reset on fork: a started thread is ordinary
        assert seen["back"] is True
    else:  # refused: nothing changed
        assert seen["during"] == os.SCHED_OTHER and seen["child"] == os.SCHED_OTHER
    assert seen["after"] == os.SCHED_OTHER
    assert _policy() == os.SCHED_OTHER  # this thread never changed
    for priority in (0, 100):
        with pytest.raises(ValueError, match="between 1 and 99"):
            realtime_thread(priority)


def test_bad_cores_are_refused() -> None:
    connect = functools.partial(intent_fetchers.answering)
    with pytest.raises(ValueError, match="at least one core"):
        ProcessIntentSource(connect, cpus=[])
    with pytest.raises(ValueError, match="at least one core"):
        ProcessIntentSource(connect, cpus=[-1])
    with pytest.raises(ValueError, match="'poll' or 'thread'"):
        ProcessIntentSource(connect, answers="pipe")  # type: ignore[arg-type]


def test_polled_answers_wait_for_the_frame_loop_and_come_on_its_thread() -> None:
    """With `answers="poll"` nothing reaches the sink between polls: no thread of the source
    runs in the game's process, and each poll hands over at most `max_messages`."""
    sink = Collector()
    source = ProcessIntentSource(intent_fetchers.answering)
    source.start(sink)
    try:
        assert not any(t.name.endswith("-reader") for t in threading.enumerate())
        for n in range(3):
            source.submit(ask("marla", n), Tier.GOLD)
        source.submit(ask("broken"), Tier.GOLD)
        sink.source = source
        sink.wait_for(1)  # polls until the first arrives
        sink.source = None
        got = len(sink.updates) + len(sink.failures)
        threading.Event().wait(0.2)
        assert len(sink.updates) + len(sink.failures) == got  # nothing while nobody polls
        handed = 0
        for _ in range(2000):  # bounded
            handed += source.poll(max_messages=1)
            if got + handed == 4:
                break
            threading.Event().wait(0.005)
        assert len(sink.updates) == 3 and isinstance(sink.failure_of("broken"), ValueError)
    finally:
        source.close()
    assert source.poll() == 0  # closed: nothing to read


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs Linux")
def test_the_child_runs_on_its_cores_below_the_game() -> None:
    mine = sorted(os.sched_getaffinity(0))
    cores = [mine[-1]]
    sink = Collector()
    source = started(intent_fetchers.answering, sink, "poll", nice=5, cpus=cores)
    try:
        source.submit(ask("cores"), Tier.GOLD)
        sink.wait_for(1)
    finally:
        source.close()
    assert sink.updates[0].bark == f"{cores} nice {os.nice(0) + 5}"
    assert sorted(os.sched_getaffinity(0)) == mine  # the game's own cores are untouched


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pinning needs Linux")
def test_a_placement_on_a_core_this_process_lacks_is_skipped_not_fatal() -> None:
    mine = os.sched_getaffinity(0)
    missing = max(mine) + 1024
    try:
        Placement(cpus=frozenset({missing})).apply()  # refused by the OS: left as it was
        assert os.sched_getaffinity(0) == mine
    finally:
        os.sched_setaffinity(0, mine)
