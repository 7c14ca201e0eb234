"""Sliding windows per partition and the lag report (pure: fed with offset readings)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from schemas.events import (
    DLQ_TOPICS,
    METADATA_TOPICS,
    TOPIC_DECODED,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    ConsumerState,
    ConsumerStatus,
)
from services.lag.collector import PartitionOffsets
from services.lag.evaluator import (
    Observation,
    Status,
    evaluate_group,
    evaluate_partition,
    lag_seconds,
    partition_lag,
)

# Every pipeline group and the topics it consumes: each is listed whether or not it has
# committed, a partition it never committed on counting from the log start.
PIPELINE_TOPICS: Mapping[str, tuple[str, ...]] = {
    "egoline-decode": (TOPIC_UPLOADED,),
    "egoline-validate": (TOPIC_DECODED,),
    "egoline-shard": (TOPIC_VALIDATED,),
    "egoline-metadata": (*METADATA_TOPICS, *DLQ_TOPICS),
}
PIPELINE_GROUPS = tuple(PIPELINE_TOPICS)
# A group whose consumer reports rewinding the same offsets this many times in a row is STALL.
STALL_REWINDS = 2


def watched_groups(extra: list[str] | None = None) -> dict[str, tuple[str, ...]]:
    """The pipeline's groups with their topics, plus `extra` groups (their topics are the ones
    they have committed on)."""
    return {**PIPELINE_TOPICS, **{g: PIPELINE_TOPICS.get(g, ()) for g in extra or ()}}


def stall_reason(status: ConsumerStatus | None, committed: Mapping[tuple[str, int], int]) -> str:
    """Why a group is stuck, from its consumer's latest status, or "" when it is not: it has
    rewound the same batch `STALL_REWINDS` times or more, or is retrying / isolating a failing
    step, and has not committed past that batch since."""
    if status is None or status.state is ConsumerState.COMMITTED:
        return ""
    if not any(committed.get((p.topic, p.partition), -1) <= p.offset for p in status.positions):
        return ""  # the group has committed past that batch since
    if status.state is ConsumerState.REWINDING and status.count < STALL_REWINDS:
        return ""
    what = {
        ConsumerState.REWINDING: f"rewound the same batch {status.count} times",
        ConsumerState.RETRYING: f"retrying a failing batch step (attempt {status.count})",
        ConsumerState.ISOLATING: "bisecting a batch to isolate the records that make it fail",
    }[status.state]
    return f"{what}: {status.reason}"


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
    never_committed: bool = False


@dataclass(frozen=True)
class GroupLag:
    """A consumer group: its worst partition's status (clamped to ERR), total and max lag."""

    status: Status
    partitions: tuple[PartitionLag, ...]
    total_lag: int
    max_lag: int
    max_lag_seconds: float
    never_committed: bool = False  # on no partition: its lag counts from the log start
    reason: str = ""  # why it is not OK, when known ("" otherwise)
    consumer_state: str | None = None  # the latest state its consumers reported

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
    _readings: dict[tuple[str, str, int], int] = field(default_factory=lambda: defaultdict(int))
    statuses: dict[str, ConsumerStatus] = field(default_factory=dict)
    groups: tuple[str, ...] = ()  # listed even with no partition read (UNKNOWN)

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
            self._readings[key] = self._readings[key] + 1 if r.never_committed else 0

    def observe_status(self, statuses: Mapping[str, ConsumerStatus]) -> None:
        """The latest consumer-status event of each group (`StatusReader.read`)."""
        self.statuses.update(statuses)

    def _status(self, key: tuple[str, str, int], reading: PartitionOffsets, now: float) -> Status:
        if not reading.never_committed:
            return evaluate_partition(list(self._windows[key]), now)
        # Nothing committed: waiting records that stay waiting over two readings are STALL.
        lag = partition_lag(reading.committed, reading.end)
        if lag is None:
            return Status.UNKNOWN
        if lag == 0:
            return Status.OK
        return Status.STALL if self._readings[key] >= 2 else Status.WARN

    def report(self, now: float) -> LagReport:
        """Per group: status, total and max lag, and per partition the fields of `egoline lag`.
        A group is listed even before any reading of it (UNKNOWN): a group that never
        committed is the one most likely stuck."""
        parts: dict[str, list[PartitionLag]] = {g: [] for g in self.groups}
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
                    status=self._status(key, reading, now),
                    never_committed=reading.never_committed,
                )
            )
        return {group: self._group(group, group_parts) for group, group_parts in parts.items()}

    def _group(self, group: str, group_parts: list[PartitionLag]) -> GroupLag:
        consumer = self.statuses.get(group)
        committed = {(p.topic, p.partition): p.committed for p in group_parts}
        stalled = stall_reason(consumer, committed)
        if stalled and consumer is not None:
            stuck = {(p.topic, p.partition) for p in consumer.positions}
            # its consumer is alive and stuck on this batch: STALL (Burrow would read STOP
            # from the missing commits, which says the consumer is gone)
            group_parts = [
                replace(p, status=Status.STALL)
                if (p.topic, p.partition) in stuck and p.status is not Status.UNKNOWN
                else p
                for p in group_parts
            ]
        never = bool(group_parts) and all(p.never_committed for p in group_parts)
        waiting = sum(p.lag or 0 for p in group_parts if p.never_committed)
        reason = stalled or (
            f"never committed: {waiting} records waiting from the log start" if waiting else ""
        )
        if not group_parts:
            reason = "no partition to read: its topics do not exist yet"
        known = [p.lag for p in group_parts if p.lag is not None]
        return GroupLag(
            status=evaluate_group([p.status for p in group_parts]),
            partitions=tuple(group_parts),
            total_lag=sum(known),
            max_lag=max(known, default=0),
            max_lag_seconds=max(
                (p.lag_seconds for p in group_parts if p.lag_seconds is not None), default=0.0
            ),
            never_committed=never,
            reason=reason,
            consumer_state=consumer.state.value if consumer is not None else None,
        )
