"""Zeroed pages handed back (`mythic.engine._pages`) and the C heap trimmed (`mythic._heap`),
on real memory of this process."""

from __future__ import annotations

import ctypes
import mmap
import struct
import sys

import pytest

from mythic import _heap
from mythic.engine._pages import (
    _READ,
    PAGE,
    anonymous_regions,
    new_spans,
    release_zeroed,
    resident_runs,
    zero_runs,
)

pytestmark = pytest.mark.unit

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and madvise")


def _private(size: int) -> mmap.mmap:
    """Private anonymous memory, as malloc's large blocks are (`mmap(-1, n)` alone is shared)."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def _resident_pages(start: int, end: int) -> int:
    """Pages of [start, end) present in memory, from /proc/self/pagemap (bit 63 of each entry):
    another reading than `mincore`, which `resident_runs` uses."""
    pages = (end - start) // PAGE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // PAGE * 8)
        entries = struct.unpack(f"{pages}Q", pagemap.read(pages * 8))
    return sum(1 for e in entries if e >> 63)


def test_new_spans_are_what_no_earlier_region_covered() -> None:
    before = [(100, 200), (300, 400)]
    after = [(100, 200), (250, 450), (500, 600)]
    assert new_spans(before, after) == [(250, 300), (400, 450), (500, 600)]
    assert new_spans([], after) == after
    assert new_spans(after, after) == []


@linux
def test_zero_runs_find_whole_zero_pages_across_reads() -> None:
    # Longer than two reads, with a non-zero page on each side of the first read's edge.
    pages = 2 * _READ // PAGE + 16
    edge = _READ // PAGE
    with _private(pages * PAGE) as area:
        start = _address(area)
        for page in (0, edge - 1, edge, edge + 40):
            area[page * PAGE + 5] = 1
        assert zero_runs(start, start + pages * PAGE) == [
            (start + PAGE, start + (edge - 1) * PAGE),
            (start + (edge + 1) * PAGE, start + (edge + 40) * PAGE),
            (start + (edge + 41) * PAGE, start + pages * PAGE),
        ]
        area[:] = bytes(pages * PAGE)
        assert zero_runs(start, start + pages * PAGE) == [(start, start + pages * PAGE)]


@linux
def test_resident_runs_are_the_pages_written() -> None:
    with _private(64 * PAGE) as area:
        start = _address(area)
        for page in (*range(3, 10), 20):
            area[page * PAGE] = 1
        assert resident_runs(start, start + 64 * PAGE) == [
            (start + 3 * PAGE, start + 10 * PAGE),
            (start + 20 * PAGE, start + 21 * PAGE),
        ]


@linux
def test_the_zeroed_buffer_is_handed_back_and_reads_the_same() -> None:
    before = anonymous_regions()
    size = 32 << 20
    area = _private(size + 2 * PAGE)
    try:
        start = _address(area)
        # As a zeroed buffer behind an allocator's header: the first page is not all zeros,
        # the buffer after it is, written (resident).
        area[:7] = b"\x01header"
        area.seek(PAGE)
        area.write(bytes(size))
        assert _resident_pages(start, start + size + PAGE) == size // PAGE + 1
        assert release_zeroed(before, 2 * size) == 0  # another size: left alone
        assert release_zeroed(before, size) == size
        assert _resident_pages(start, start + size + PAGE) == 1
        assert area[:7] == b"\x01header"
        assert area[PAGE : PAGE + size] == bytes(size)
        area[size] = 7  # written again: resident again, and kept
        assert area[size] == 7
    finally:
        area.close()


@linux
def test_nothing_is_handed_back_without_regions_to_compare_with() -> None:
    assert release_zeroed([], 1 << 20) == 0


@linux
def test_freed_heap_pages_go_back_to_the_system_on_glibc() -> None:
    # Blocks under glibc's mmap threshold come from the heap; freed, they stay with the
    # process until trimmed.
    blocks = [bytearray(64 * 1024) for _ in range(512)]
    del blocks
    assert _heap.trim() is True
