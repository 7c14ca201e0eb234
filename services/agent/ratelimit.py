"""A token bucket for the upload bandwidth cap (pure: the clock and sleep are injected)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Allow `rate` bytes per second on average, with bursts up to `burst` bytes."""

    def __init__(
        self,
        rate: float,
        burst: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.sleep = sleep
        self._tokens = burst
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(self, amount: float) -> float:
        """Block until `amount` bytes may go; returns the seconds waited. An amount above the
        burst is allowed after the bucket refills completely (it then goes into debt)."""
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= amount
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self.sleep(wait)
        return wait
