"""Time for the memory tiers, injectable so tests can jump days ahead."""

from __future__ import annotations

import time
from typing import Protocol

DAY_S = 86_400.0
GAME_MINUTES_PER_DAY = 1440
"""A game day in game minutes, the unit of `game_time` (the game's calendar)."""


class Clock(Protocol):
    """Wall-clock seconds since the epoch, as the memory tiers see them."""

    def now(self) -> float: ...


class SystemClock:
    """The real wall clock."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told: `advance(days=7)` jumps a week.

    Windows and TTLs in every tier are judged by this clock (Redis keys also get a real TTL as
    a backstop, which a jumped clock does not shorten).
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float = 0.0, *, days: float = 0.0) -> None:
        if seconds < 0 or days < 0:
            raise ValueError("a clock only moves forward")
        self._now += seconds + days * DAY_S
