"""Where the game's frame loop and the model's processes run: priorities and CPU cores.

A frame that shares its core with a model's matrix multiplications, or with a client parsing
JSON, waits for the scheduler, however low their priority: `nice` alone leaves frames over
budget. Pinning the frame loop to cores of its own and the model's processes (the server, the
intent client) to the others takes the model off the frame path's cores entirely. The rest
of the machine (its databases, the kernel's workers) still lands on the game's cores now and
then: a frame loop under a real-time policy (`realtime_thread`) runs as soon as its frame is
due, ahead of every ordinary process there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from dataclasses import dataclass

__all__ = [
    "CoreSplit",
    "Placement",
    "ordinary_thread",
    "pin_thread",
    "realtime_thread",
    "split_cores",
]


@dataclass(frozen=True, slots=True)
class Placement:
    """A process's priority and cores, applied by the process itself (picklable).

    Attributes:
        nice: added to the process's niceness (0-19; POSIX).
        cpus: the cores it may run on; None leaves them as inherited.
    """

    nice: int = 0
    cpus: frozenset[int] | None = None

    def apply(self) -> None:
        """Apply to the calling process, where the OS can: niceness on POSIX, cores on
        Linux; elsewhere (or when refused) it is skipped."""
        if self.nice and hasattr(os, "nice"):
            with contextlib.suppress(OSError):
                os.nice(self.nice)
        if self.cpus:
            pin_thread(self.cpus)


@dataclass(frozen=True, slots=True)
class CoreSplit:
    """Cores for the game's frame loop and cores for the model's processes (disjoint)."""

    game: frozenset[int]
    model: frozenset[int]


def split_cores(model_cores: int, available: Collection[int] | None = None) -> CoreSplit | None:
    """Give the model's processes `model_cores` of the cores this process may use (the last
    ones) and the game the rest, at least one; None where cores cannot be pinned (not Linux)
    or there is only one.

    Raises:
        ValueError: `model_cores` is below 1.
    """
    if model_cores < 1:
        raise ValueError("model_cores must be at least 1")
    if available is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        available = os.sched_getaffinity(0)
    cores = sorted(available)
    if len(cores) < 2:
        return None
    model = min(model_cores, len(cores) - 1)
    return CoreSplit(game=frozenset(cores[:-model]), model=frozenset(cores[-model:]))


def pin_thread(cpus: Collection[int]) -> bool:
    """Pin the calling thread (and the threads and processes it starts later) to `cpus`;
    False where the OS cannot (not Linux) or refuses (a core outside this container's)."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True


def realtime_thread(priority: int = 1) -> bool:
    """Run the calling thread (the frame loop) under the real-time FIFO policy at `priority`:
    once its frame is due it runs ahead of every ordinary thread on its cores, rather than
    waiting for the scheduler to take one off. It must sleep between frames (a paced loop
    does), or it starves its cores; Linux keeps 5% of each second for ordinary threads
    anyway. Threads and processes it starts later run ordinary (reset on fork).

    False where the OS cannot (not Linux) or refuses (no CAP_SYS_NICE and no rtprio limit).

    Raises:
        ValueError: `priority` is outside 1-99.
    """
    if not 1 <= priority <= 99:
        raise ValueError("priority must be between 1 and 99")
    if not hasattr(os, "sched_setscheduler"):
        return False
    policy = os.SCHED_FIFO | getattr(os, "SCHED_RESET_ON_FORK", 0)
    try:
        os.sched_setscheduler(0, policy, os.sched_param(priority))
    except OSError:
        return False
    return True


def ordinary_thread() -> bool:
    """Put the calling thread back under the ordinary time-sharing policy; False where the OS
    cannot or refuses."""
    if not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return False
    return True
