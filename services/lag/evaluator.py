"""Burrow's consumer-lag evaluation and kafka-lag-exporter's lag in seconds, as pure functions.

Per partition, a sliding window of the last N observations (wall time, committed offset, lag)
is evaluated with Burrow's rules, in Burrow's order:
1. lag was 0 in any observation of the window        -> OK
2. a committed offset went backwards                  -> REWIND
3. now - last commit > last commit - first commit      -> STOP (no commits lately; evaluated
   against `now`, so a dead consumer is reported even though it commits nothing)
4. all committed offsets equal while lagging           -> STALL
5. lag never decreased across the window               -> WARN
6. otherwise                                            -> OK
A group is its worst partition, clamped to ERR (STOP, STALL and REWIND count as ERR).

Differences from Burrow: the window is evaluated before it is full (STOP from one commit on,
STALL and WARN from two; Burrow waits for a full window, so a consumer that commits once and
dies would never be reported), and an observation whose lag is unknown (the broker reported a
log-end offset below the committed one) makes the partition UNKNOWN, never a negative lag.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class Status(IntEnum):
    """Ordered by severity; a group takes its worst partition's."""

    OK = 0
    WARN = 1
    UNKNOWN = 2
    STALL = 3
    STOP = 4
    REWIND = 5
    ERR = 6


@dataclass(frozen=True)
class Observation:
    at: float  # wall time of the commit observation, seconds
    committed: int
    lag: int | None  # None: unknown (end offset below committed)


def partition_lag(committed: int, end: int) -> int | None:
    """Messages behind, or None when the broker's end offset is below the committed offset
    (impossible on Kafka; seen with the embedded broker's ListOffsets, docs/stack.md)."""
    if end < committed:
        return None
    return end - committed


def evaluate_partition(window: Sequence[Observation], now: float, min_entries: int = 2) -> Status:
    """Burrow's status of one partition from its window of observations (oldest first)."""
    if not window:
        return Status.UNKNOWN
    if any(o.lag is None for o in window):
        return Status.UNKNOWN
    lags = [int(o.lag or 0) for o in window]
    if any(lag == 0 for lag in lags):
        return Status.OK
    offsets = [o.committed for o in window]
    if any(b < a for a, b in itertools.pairwise(offsets)):
        return Status.REWIND
    first, last = window[0].at, window[-1].at
    if now - last > last - first:
        return Status.STOP
    if len(window) < min_entries:
        return Status.OK
    if all(offset == offsets[0] for offset in offsets):
        return Status.STALL
    if all(b >= a for a, b in itertools.pairwise(lags)):
        return Status.WARN
    return Status.OK


def evaluate_group(partition_statuses: Sequence[Status]) -> Status:
    """A group's status: its worst partition, with STOP, STALL and REWIND reported as ERR."""
    if not partition_statuses:
        return Status.UNKNOWN
    worst = max(partition_statuses)
    return Status.ERR if worst >= Status.STALL else worst


def lag_seconds(committed: int, samples: Sequence[tuple[int, float]], now: float) -> float | None:
    """Seconds the consumer is behind: now minus the interpolated time the committed offset was
    the log end, from (log-end offset, wall time) samples (kafka-lag-exporter's method).

    Samples are sorted by offset and deduplicated here. At or past the newest sample the lag is
    0; between samples the time is linearly interpolated; before the oldest it is extrapolated
    from the two oldest (a bursty topic makes this jump: the estimate is only as fine as the
    samples). None without samples.
    """
    points = sorted({offset: at for offset, at in samples}.items())
    if not points:
        return None
    offsets = [p[0] for p in points]
    if committed >= offsets[-1]:
        return 0.0
    i = bisect.bisect_right(offsets, committed)
    if i == 0:
        if len(points) < 2:
            return max(0.0, now - points[0][1])
        (o1, t1), (o2, t2) = points[0], points[1]
    else:
        (o1, t1), (o2, t2) = points[i - 1], points[i]
    at = t1 + (committed - o1) * (t2 - t1) / (o2 - o1)
    return max(0.0, now - at)
