"""Giving the C heap's freed memory back to the system (glibc's allocator; elsewhere a no-op).

glibc keeps what a process frees in its arenas for the next allocation, so a process's
resident memory stays at its peak: after a model's graph was parsed and dropped, after a burst
of parked KV, after a world reload built its new index beside the old one. Two remedies, used by
the server and the speech workers:

- `fix_mmap_threshold`: blocks of a MiB or more always get pages of their own (`mmap`), which
  go back to the system when freed (process-wide: `mythic serve` sets it for itself; the
  speech workers do not: onnxruntime without its arena then maps and faults in every large
  buffer of every clause, measured 80% slower synthesis). By default glibc raises that
  threshold to the size of each such block freed (up to 32 MiB), after which blocks of parked
  KV, prompts' token arrays and audio come from the heap and leave it fragmented, resident
  memory rising in steps.
- `trim`: `malloc_trim(0)`, the free pages of every arena back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 1 << 20
"""Blocks this large or larger are mapped on their own (`fix_mmap_threshold`)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to do
    return libc


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Map blocks of `size` bytes or more on their own from now on, the threshold fixed (not
    raised by glibc as blocks are freed). False where the allocator is not glibc's."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, size))


def trim() -> bool:
    """Give the heap's free pages back to the system. True when some were; False also where
    the allocator is not glibc's."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
