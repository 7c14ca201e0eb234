"""Pure scheduling: pack jobs onto worker processes by cost, ramp concurrency up, stagger starts.

Longest-processing-time-first (LPT) puts each job, largest first, on the least-loaded worker;
its makespan is within 4/3 of the optimum, so workers of a batch finish close together.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


def lpt_assign(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Job indexes per worker (each list in submission order); every job on exactly one worker."""
    if workers < 1:
        raise ValueError("need at least one worker")
    loads = [0.0] * workers
    plan: list[list[int]] = [[] for _ in range(workers)]
    for job in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        target = min(range(workers), key=lambda w: (loads[w], w))
        plan[target].append(job)
        loads[target] += costs[job]
    # LPT places largest first; each worker then runs its share in submission order.
    return [sorted(p) for p in plan if p]


def makespan_ratio(worker_busy_s: Sequence[float], wall_s: float) -> float:
    """Batch wall time over the ideal (total busy time spread evenly); 1.0 is perfect."""
    busy = sum(worker_busy_s)
    if busy <= 0 or not worker_busy_s:
        return 1.0
    return wall_s / (busy / len(worker_busy_s))


@dataclass
class Ramp:
    """Slow start: the first batch runs on one worker, each next batch on one more, up to the
    maximum, so a fleet restarted together doesn't hit the object store at full width at once."""

    maximum: int
    current: int = 1

    def next_width(self) -> int:
        width = min(self.maximum, self.current)
        self.current = min(self.maximum, self.current + 1)
        return width


def start_delay_s(max_delay_s: float, rng: random.Random) -> float:
    """Staggered start: seconds to wait before connecting, uniform in [0, max_delay_s], so a
    fleet restarted together spreads its first broker and object-store calls over the window.
    Raises ValueError for a negative maximum."""
    if max_delay_s < 0:
        raise ValueError("max_delay_s must be >= 0")
    return rng.uniform(0.0, max_delay_s)
