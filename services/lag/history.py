"""A bounded history of lag per group and per partition, for the lag page's chart (pure).

One point per evaluation of the lag service (every poll, ~2 s): `max_points` points cover
`max_points * interval` seconds (300 points at 2 s: the last 10 minutes). A poll that could not
read the broker records `None` (a gap in the chart) rather than repeating stale values.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from services.lag.monitor import LagReport

# (wall time s, lag in messages or None, lag seconds or None)
Point = tuple[float, int | None, float | None]


@dataclass
class LagHistory:
    max_points: int = 300
    _groups: dict[str, deque[tuple[Point, str]]] = field(default_factory=dict)
    _partitions: dict[tuple[str, str, int], deque[Point]] = field(default_factory=dict)

    def record(self, report: LagReport, at: float, readable: bool) -> None:
        """Append one point per group (total lag, max lag seconds, status) and per partition
        of `report` (the shape of `LagMonitor.report`); `readable=False`: the broker could not
        be read, so lag values are recorded as unknown."""
        for group, entry in report.items():
            points = self._groups.setdefault(group, deque(maxlen=self.max_points))
            status = entry.status.name
            if readable:
                points.append(((at, entry.total_lag, entry.max_lag_seconds), status))
            else:
                points.append(((at, None, None), status))
            for p in entry.partitions:
                key = (group, p.topic, p.partition)
                series = self._partitions.setdefault(key, deque(maxlen=self.max_points))
                if readable:
                    series.append((at, p.lag, p.lag_seconds))
                else:
                    series.append((at, None, None))

    def to_json(self) -> dict[str, Any]:
        """`{"groups": {group: {"t": [...], "lag": [...], "lag_seconds": [...], "status": [...],
        "partitions": [{"topic", "partition", "t", "lag", "lag_seconds"}]}}}`, oldest first."""
        groups: dict[str, Any] = {}
        for group, points in sorted(self._groups.items()):
            groups[group] = {
                "t": [round(p[0], 3) for p, _ in points],
                "lag": [p[1] for p, _ in points],
                "lag_seconds": [p[2] for p, _ in points],
                "status": [status for _, status in points],
                "partitions": [],
            }
        for (group, topic, partition), series in sorted(self._partitions.items()):
            groups[group]["partitions"].append(
                {
                    "topic": topic,
                    "partition": partition,
                    "t": [round(p[0], 3) for p in series],
                    "lag": [p[1] for p in series],
                    "lag_seconds": [p[2] for p in series],
                }
            )
        return {"max_points": self.max_points, "groups": groups}
