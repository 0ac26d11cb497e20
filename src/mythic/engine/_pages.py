"""Memory that is reserved but not yet used: zeroed pages handed back to the system (Linux).

llama.cpp zeroes a context's KV buffer when it creates it (so that no cell holds a NaN), and
writing those zeros makes every page of it resident: an engine of 16 sequences of 2048 tokens
on Qwen 0.5B holds 384 MB from its first second, whatever its NPCs have said. A private
anonymous page that reads as zeros can be given back (`madvise(MADV_DONTNEED)`): the next read
of it is a fresh zero page, the same bytes, and the next write makes it resident again. So,
once a context exists, `release_zeroed` hands back the buffer it has just zeroed, and KV memory
becomes resident as the NPCs' sequences fill it (the pages of the cells written; at most what
was reserved).

Which pages: in the anonymous memory mapped while the context was made (`anonymous_regions`
before and after), among the pages that are resident (`mincore`), the one run that reads as
zeros (through /proc/self/mem, which answers an error rather than a crash for a page unmapped
meanwhile) and is as long as the KV buffer, within `tolerance`. The context's other new
buffers (compute, outputs) are not resident yet and the allocator's header is not zero, so
they bound that run; a run of another length (another thread's memory merged beside it, a
model whose cache is shaped otherwise) is left alone, and nothing is handed back. The run is
the new context's, which nothing uses before its first decode.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import sys
from pathlib import Path
from typing import Any

from mythic._extras import require

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_MADV_NOHUGEPAGE = 15  # written cells then fault in pages, not 2 MB at a time (THP "always")
_READ = 1 << 21  # bytes read at once to check for zeros

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
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


def resident_runs(start: int, end: int) -> list[Region]:
    """The runs of resident pages in [start, end) (page-aligned); none where `mincore` fails
    (the span was unmapped meanwhile)."""
    libc = _libc()
    pages = (end - start) // PAGE
    if libc is None or pages <= 0:
        return []
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(start, end - start, vec) != 0:
        return []
    np = require("numpy", package="numpy", extra="llm")
    resident = np.frombuffer(vec, dtype=np.uint8) & 1
    edges = np.flatnonzero(np.diff(np.concatenate(([0], resident, [0])).astype(np.int8)))
    return [
        (start + int(a) * PAGE, start + int(b) * PAGE)
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


def zero_runs(start: int, end: int) -> list[Region]:
    """The runs of pages in [start, end) (page-aligned) that read as zeros, read through
    /proc/self/mem: a page unmapped meanwhile ends the reading (the runs found before it are
    kept) rather than crashing the process."""
    np = require("numpy", package="numpy", extra="llm")
    runs: list[Region] = []
    run_start: int | None = None
    address = start
    try:
        fd = os.open("/proc/self/mem", os.O_RDONLY)
    except OSError:
        return []
    try:
        while address < end:
            data = os.pread(fd, min(_READ, end - address), address)
            if len(data) < PAGE:
                break
            pages = len(data) // PAGE
            words = np.frombuffer(data, dtype=np.uint64, count=pages * PAGE // 8)
            zero = ~words.reshape(pages, PAGE // 8).any(axis=1)
            # The pages of this block where a run starts or ends.
            states = np.concatenate(([run_start is not None], zero)).astype(np.int8)
            for edge in np.flatnonzero(np.diff(states)):
                page_at = address + int(edge) * PAGE
                if run_start is None:
                    run_start = page_at
                else:
                    runs.append((run_start, page_at))
                    run_start = None
            address += pages * PAGE
    except OSError:
        pass  # unmapped meanwhile: what was read stands
    finally:
        os.close(fd)
    if run_start is not None:
        runs.append((run_start, address))
    return runs


def release_zeroed(before: list[Region], size: int, tolerance: float = 0.02) -> int:
    """Hand back the buffer of `size` bytes (within `tolerance`) zeroed since `before` was
    taken (`anonymous_regions`): the bytes handed back; 0 where no such run is found, or
    where this is not Linux with glibc."""
    libc = _libc()
    if libc is None or not before or size <= 0:
        return 0
    low, high = size * (1 - tolerance) - 2 * PAGE, size * (1 + tolerance) + 2 * PAGE
    for span_start, span_end in new_spans(before, anonymous_regions()):
        if span_end - span_start < low:
            continue
        for resident_start, resident_end in resident_runs(span_start, span_end):
            if resident_end - resident_start < low:
                continue
            for start, end in zero_runs(resident_start, resident_end):
                if low <= end - start <= high:
                    libc.madvise(start, end - start, _MADV_NOHUGEPAGE)  # refused without THP
                    if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                        return end - start
                    return 0
    return 0
