"""Giving the C heap's freed memory back to the system (glibc's allocator; elsewhere a no-op).

glibc keeps what a process frees in its arenas for the next allocation, so a process's
resident memory stays near its peak: after a model's graph was parsed and dropped, after a
burst of parked KV, after a world reload built its new index beside the old one. `trim`
(`malloc_trim(0)`) gives the free pages of every arena back to the system: the server does
every `server.heap_trim_s`, each speech worker once its model is loaded.

Fixing glibc's mmap threshold instead (every block of a MiB or more on pages of its own) was
measured and left out: the embedder's batches ran 35% slower, the engine 5-15%, and Piper
without onnxruntime's arena 80% slower, each large block mapped and faulted in anew.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to do
    return libc


def trim() -> bool:
    """Give the heap's free pages back to the system. True when some were; False also where
    the allocator is not glibc's."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))
