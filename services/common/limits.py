"""The resource limits a worker process runs under: an address-space cap for the process
(RLIMIT_AS) and a wall-time cap per job (an interval timer). A hostile file that makes a
decoder allocate or loop without bound then fails its own job (`resource_limit`) instead of
taking the node's memory or a worker forever."""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from services.common.stage import JobTimeLimit


def apply_memory_limit(limit_mb: int) -> None:
    """Cap this process's address space at `limit_mb` MiB (0: leave it), never above the hard
    limit it already has. An allocation past it fails (MemoryError, or the decoder's ENOMEM)."""
    if limit_mb <= 0:
        return
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `JobTimeLimit` in this (main) thread if the block runs longer than `seconds`
    (0: no limit). Python runs the handler between bytecodes, so a decode loop stops at its
    next packet; a single C call that never returns is the stage's liveness probe's job."""
    if seconds <= 0:
        yield
        return

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise JobTimeLimit(f"job ran longer than its time limit of {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
