"""SlackGC: Python's cyclic garbage collection kept out of frames, run between them."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from mythic.control import SlackGC

pytestmark = pytest.mark.unit


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(100, 3, 2)
    yield
    gc.set_threshold(*before)


def allocate(n: int) -> None:
    for _ in range(n):
        Node()


def test_no_collection_inside_frames_the_due_one_between_them(thresholds: None) -> None:
    enabled = gc.isenabled()
    with SlackGC() as slack:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        node = Node()
        dead = weakref.ref(node)
        del node
        allocate(500)  # a frame's garbage, five times the threshold: nothing runs by itself
        assert dead() is not None
        assert slack.due() == 0
        assert slack.collect() == 0  # between frames: the young generation
        assert dead() is None
        assert slack.collect() is None  # nothing due any more
    assert gc.isenabled() == enabled and gc.get_freeze_count() == 0


def test_older_generations_come_due_by_cpythons_counts(thresholds: None) -> None:
    with SlackGC() as slack:
        generations = []
        for _ in range(16):
            allocate(150)
            generations.append(slack.collect())
    # As CPython counts: a generation is due once its count is above its threshold, the
    # oldest first: four young collections, then the middle one; three of those, then the
    # oldest at the next allocation past the young threshold.
    assert generations == [0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 2]
    assert slack.collections == [12, 3, 1]


def test_it_waits_for_slack_that_fits_until_far_behind(thresholds: None) -> None:
    with SlackGC(freeze=False) as slack:
        allocate(150)
        assert slack.collect(0.0) == 0  # the first of a generation runs in any slack
        assert slack.cost_s[0] > 0.0
        allocate(150)
        assert slack.collect(0.0) is None  # it took longer than this: the frame comes first
        assert slack.collect(1.0) == 0
        allocate(1000)
        assert slack.collect(0.0) == 0  # ... but never without bound
    assert slack.collect() is None  # outside its block it does nothing


def test_a_heap_the_game_froze_stays_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with SlackGC():
            pass
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()


def test_it_gives_back_a_collector_that_was_off() -> None:
    gc.disable()
    try:
        with SlackGC():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
