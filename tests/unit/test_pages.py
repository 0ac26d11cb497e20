"""Zeroed pages handed back (`mythic.engine._pages`) and the C heap trimmed (`mythic._heap`),
on real memory of this process."""

from __future__ import annotations

import ctypes
import mmap
import sys

import pytest

from mythic import _heap
from mythic.engine._pages import PAGE, anonymous_regions, new_spans, release_zeroed, zero_runs

pytestmark = pytest.mark.unit

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and madvise")


def _resident_kb(start: int, end: int) -> int:
    """Resident KB of the mappings inside [start, end), from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low >= start and high <= end
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def _private(size: int) -> mmap.mmap:
    """Private anonymous memory, as malloc's large blocks are (`mmap(-1, n)` alone is shared)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def test_new_spans_are_what_no_earlier_region_covered() -> None:
    before = [(100, 200), (300, 400)]
    after = [(100, 200), (250, 450), (500, 600)]
    assert new_spans(before, after) == [(250, 300), (400, 450), (500, 600)]
    assert new_spans([], after) == after
    assert new_spans(after, after) == []


@linux
def test_zero_runs_find_whole_zero_pages_only() -> None:
    with _private(64 * PAGE) as area:
        start = ctypes.addressof(ctypes.c_char.from_buffer(area))
        area[10 * PAGE + 7] = 1  # page 10 is not zero
        area[40 * PAGE] = 255  # nor page 40
        runs = zero_runs(start, start + 64 * PAGE, 4 * PAGE)
        assert runs == [
            (start, start + 10 * PAGE),
            (start + 11 * PAGE, start + 40 * PAGE),
            (start + 41 * PAGE, start + 64 * PAGE),
        ]
        # A run shorter than asked is left out.
        assert zero_runs(start, start + 64 * PAGE, 25 * PAGE) == [
            (start + 11 * PAGE, start + 40 * PAGE)
        ]
        del start


@linux
def test_released_zero_pages_read_the_same_and_are_no_longer_resident() -> None:
    before = anonymous_regions()
    size = 32 << 20
    area = _private(size)
    try:
        start = ctypes.addressof(ctypes.c_char.from_buffer(area))
        area.write(bytes(size))  # zeros written: every page resident, as llama.cpp's clear
        area[5 * PAGE + 3] = 42
        assert _resident_kb(start, start + size) >= size // 1024 - 4
        released = release_zeroed(before, 8 << 20)
        assert released >= size - 6 * PAGE
        assert _resident_kb(start, start + size) < 1024
        assert area[5 * PAGE + 3] == 42
        assert area[: 5 * PAGE] == bytes(5 * PAGE)
        assert area[6 * PAGE :] == bytes(size - 6 * PAGE)
        area[size - 1] = 7  # written again: resident again, and kept
        assert area[size - 1] == 7
        del start
    finally:
        area.close()


@linux
def test_nothing_is_released_without_regions_to_compare_with() -> None:
    assert release_zeroed([], 1 << 20) == 0


@linux
def test_the_heap_is_trimmed_and_large_blocks_mapped_on_glibc() -> None:
    assert _heap.fix_mmap_threshold() is True
    blocks = [bytearray(256 * 1024) for _ in range(64)]
    del blocks
    assert isinstance(_heap.trim(), bool)
