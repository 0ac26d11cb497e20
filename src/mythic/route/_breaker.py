"""A circuit breaker per endpoint: after `failures` consecutive failures the endpoint is
skipped for `cooldown_s`; then one request probes it (half-open): success closes the breaker,
failure opens it again."""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    def __init__(
        self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.opens = 0
        """Times it opened."""
        self._probing = False

    def available(self) -> bool:
        """Whether a request may go to the endpoint now (no state change)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return self.clock() - self.opened_at >= self.cooldown_s
        return not self._probing

    def acquire(self) -> None:
        """A request goes to the endpoint: an open breaker past its cooldown turns half-open
        and this request is its probe."""
        if self.state is BreakerState.OPEN:
            self.state = BreakerState.HALF_OPEN
        if self.state is BreakerState.HALF_OPEN:
            self._probing = True

    def success(self) -> None:
        self.state = BreakerState.CLOSED
        self.failures = 0
        self._probing = False

    def failure(self) -> None:
        self.failures += 1
        self._probing = False
        if self.state is BreakerState.HALF_OPEN or self.failures >= self.threshold:
            if self.state is not BreakerState.OPEN:
                self.opens += 1
            self.state = BreakerState.OPEN
            self.opened_at = self.clock()

    def release(self) -> None:
        """A request ended without telling anything about the endpoint (cancelled, refused
        as invalid): a probe slot opens again."""
        self._probing = False
