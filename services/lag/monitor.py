"""Sliding windows per partition and the lag report (pure: fed with offset readings)."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from services.lag.collector import PartitionOffsets
from services.lag.evaluator import (
    Observation,
    Status,
    evaluate_group,
    evaluate_partition,
    lag_seconds,
    partition_lag,
)

PIPELINE_GROUPS = ("egoline-decode", "egoline-validate", "egoline-shard", "egoline-metadata")


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group: offsets, lag in messages (None: nothing committed yet) and
    seconds (None: not known yet), and its Burrow status."""

    topic: str
    partition: int
    committed: int
    end: int
    lag: int | None
    lag_seconds: float | None
    status: Status


@dataclass(frozen=True)
class GroupLag:
    """A consumer group: its worst partition's status (clamped to ERR), total and max lag."""

    status: Status
    partitions: tuple[PartitionLag, ...]
    total_lag: int
    max_lag: int
    max_lag_seconds: float

    def unknown(self) -> GroupLag:
        """The same group when the broker could not be read: its status is not known."""
        return replace(self, status=Status.UNKNOWN)

    def to_json(self) -> dict[str, Any]:
        """The group's entry of `egoline lag --json` and `/lag.json` (statuses by name)."""
        out = asdict(self)
        out["status"] = self.status.name
        for part, src in zip(out["partitions"], self.partitions, strict=True):
            part["status"] = src.status.name
        return out


LagReport = dict[str, GroupLag]


def report_json(report: LagReport) -> dict[str, Any]:
    return {group: entry.to_json() for group, entry in report.items()}


@dataclass
class LagMonitor:
    window: int = 10  # Burrow's default window of commits
    end_samples: int = 120  # (log-end offset, time) samples kept per partition for lag seconds
    _windows: dict[tuple[str, str, int], deque[Observation]] = field(default_factory=dict)
    _ends: dict[tuple[str, int], deque[tuple[int, float]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    _latest: dict[tuple[str, str, int], PartitionOffsets] = field(default_factory=dict)

    def observe(self, readings: list[PartitionOffsets]) -> None:
        for r in readings:
            key = (r.group, r.topic, r.partition)
            history = self._windows.setdefault(key, deque(maxlen=self.window))
            # Burrow keeps one entry per commit: a reading without a new commit only refreshes
            # the lag of the latest entry (so a stopped consumer's window keeps its old times).
            if history and history[-1].committed == r.committed:
                history[-1] = Observation(
                    history[-1].at, r.committed, partition_lag(r.committed, r.end)
                )
            else:
                history.append(Observation(r.at, r.committed, partition_lag(r.committed, r.end)))
            ends = self._ends[(r.topic, r.partition)]
            if ends and ends[-1][0] == r.end:
                # The log end has not moved: keep the *last* time it was seen there, so a burst
                # after a quiet spell is timed from just before the burst, not from the start
                # of the quiet spell (which would report the idle time as lag).
                ends[-1] = (r.end, r.at)
            else:
                ends.append((r.end, r.at))
                while len(ends) > self.end_samples:
                    ends.popleft()
            self._latest[key] = r

    def report(self, now: float) -> LagReport:
        """Per group: status, total and max lag, and per partition the fields of `egoline lag`."""
        parts: dict[str, list[PartitionLag]] = {}
        for key, reading in sorted(self._latest.items()):
            group, topic, partition = key
            lag = partition_lag(reading.committed, reading.end)
            seconds = lag_seconds(reading.committed, list(self._ends[(topic, partition)]), now)
            parts.setdefault(group, []).append(
                PartitionLag(
                    topic=topic,
                    partition=partition,
                    committed=reading.committed,
                    end=reading.end,
                    lag=lag,
                    lag_seconds=None if lag is None or seconds is None else round(seconds, 3),
                    status=evaluate_partition(list(self._windows[key]), now),
                )
            )
        report: LagReport = {}
        for group, group_parts in parts.items():
            known = [p.lag for p in group_parts if p.lag is not None]
            report[group] = GroupLag(
                status=evaluate_group([p.status for p in group_parts]),
                partitions=tuple(group_parts),
                total_lag=sum(known),
                max_lag=max(known, default=0),
                max_lag_seconds=max(
                    (p.lag_seconds for p in group_parts if p.lag_seconds is not None),
                    default=0.0,
                ),
            )
        return report
