"""The one backoff policy: exponential with full jitter, used by every stage's rewind, the
metadata service, the device agent and the object store's read retries."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from services.common.stage import is_transient

T = TypeVar("T")
log = logging.getLogger("egoline.retry")


def backoff_delay(attempt: int, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Seconds to wait before retry number `attempt` (0-based): full jitter, uniform in
    [0, min(cap, base * 2^attempt)] (the AWS architecture blog's "full jitter")."""
    return random.uniform(0, min(cap_s, base_s * 2 ** max(0, attempt)))


def with_retries(
    call: Callable[[], T],
    max_total_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run `call`, retrying transient failures (`is_transient`) until `max_total_s` has
    passed; anything else (and the last transient failure at the deadline) is raised."""
    deadline = clock() + max_total_s
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc) or clock() >= deadline:
                raise
            delay = min(backoff_delay(attempt), max(0.0, deadline - clock()))
            log.warning(
                "transient failure (attempt %d), retrying in %.1fs: %s", attempt + 1, delay, exc
            )
            sleep(delay)
            attempt += 1
