"""Memory that is reserved but not yet used: zeroed pages handed back to the system (Linux).

llama.cpp zeroes a context's KV buffer when it creates it (so that no cell holds a NaN), and
writing those zeros makes every page of it resident: an engine of 16 sequences of 2048 tokens
on Qwen 0.5B holds 384 MB from its first second, whatever its NPCs have said. A private
anonymous page that reads as zeros can be given back (`madvise(MADV_DONTNEED)`): the next read
of it is a fresh zero page, the same bytes, and the next write makes it resident again. So,
once a context exists, `release_zeroed` hands back the runs of zero pages that appeared with
it, and KV memory becomes resident as the NPCs' sequences fill it (the pages of the cells
written; at most what was reserved).

Only runs of at least `min_run` bytes (the backend gives half its KV buffer's size) are handed
back, in the regions that appeared or grew while the context was made (`anonymous_regions`
before and after), right after it was made and before any decode: such a run is that buffer
(with, at most, untouched neighbouring pages of the same context), which nothing else uses yet.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import sys
from pathlib import Path
from typing import Any

from mythic._extras import require

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_SCAN = 1 << 21  # bytes read at once while looking for zero pages

Region = tuple[int, int]
"""[start, end) addresses of a mapping."""


def anonymous_regions() -> list[Region]:
    """The process's private, writable, anonymous mappings (empty where there is no Linux
    /proc)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) >= 5 and fields[1] == "rw-p" and (len(fields) == 5 or not fields[5]):
            start, end = fields[0].split("-")
            found.append((int(start, 16), int(end, 16)))
    return found


def new_spans(before: list[Region], after: list[Region]) -> list[Region]:
    """The parts of `after`'s regions that no region of `before` covered."""
    spans = []
    earlier = sorted(before)
    for start, end in after:
        cursor = start
        for b_start, b_end in earlier:
            if b_end <= cursor or b_start >= end:
                continue
            if b_start > cursor:
                spans.append((cursor, b_start))
            cursor = max(cursor, b_end)
        if cursor < end:
            spans.append((cursor, end))
    return spans


@functools.cache
def _madvise() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        madvise = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def zero_runs(start: int, end: int, min_run: int) -> list[Region]:
    """The runs of whole pages in [start, end) (page-aligned) that read as zeros, `min_run`
    bytes or longer. Reading a page never written maps the shared zero page: looking costs no
    memory."""
    np = require("numpy", package="numpy", extra="llm")
    runs: list[Region] = []
    run_start: int | None = None
    address = start
    while address < end:
        size = min(_SCAN, end - address)
        view = np.frombuffer((ctypes.c_char * size).from_address(address), dtype=np.uint64)
        zero = ~view.reshape(size // PAGE, PAGE // 8).any(axis=1)
        # The pages of this block where a run starts or ends.
        states = np.concatenate(([run_start is not None], zero)).astype(np.int8)
        for edge in np.flatnonzero(np.diff(states)):
            page_at = address + int(edge) * PAGE
            if run_start is None:
                run_start = page_at
            else:
                if page_at - run_start >= min_run:
                    runs.append((run_start, page_at))
                run_start = None
        address += size
    if run_start is not None and end - run_start >= min_run:
        runs.append((run_start, end))
    return runs


def release_zeroed(before: list[Region], min_run: int) -> int:
    """Hand back the runs of zero pages (`min_run` bytes or longer) in the anonymous memory
    mapped since `before` was taken (`anonymous_regions`); the bytes handed back (0 where
    this is not Linux with glibc)."""
    madvise = _madvise()
    if madvise is None or not before or min_run <= 0:
        return 0
    released = 0
    for start, end in new_spans(before, anonymous_regions()):
        if end - start < min_run:
            continue
        for run_start, run_end in zero_runs(start, end, min_run):
            if madvise(run_start, run_end - run_start, _MADV_DONTNEED) == 0:
                released += run_end - run_start
            else:
                log.debug("madvise failed: errno %d", ctypes.get_errno())
    return released
