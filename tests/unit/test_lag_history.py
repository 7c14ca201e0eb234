"""The lag page's bounded history of lag per group and partition."""

from __future__ import annotations

from services.lag.evaluator import Status
from services.lag.history import LagHistory
from services.lag.monitor import GroupLag, LagReport, PartitionLag


def report(total: int, partition_lags: list[int | None], status: str = "OK") -> LagReport:
    return {
        "g": GroupLag(
            status=Status[status],
            total_lag=total,
            max_lag=max((x for x in partition_lags if x is not None), default=0),
            max_lag_seconds=1.5,
            partitions=tuple(
                PartitionLag("t", i, 0, 0, lag, 1.5, Status[status])
                for i, lag in enumerate(partition_lags)
            ),
        )
    }


def test_history_keeps_the_newest_points_per_group_and_partition() -> None:
    history = LagHistory(max_points=3)
    for i in range(5):
        history.record(report(i, [i, 0]), at=100.0 + i, readable=True)
    g = history.to_json()["groups"]["g"]
    assert g["t"] == [102.0, 103.0, 104.0]
    assert g["lag"] == [2, 3, 4]
    assert [p["lag"] for p in g["partitions"]] == [[2, 3, 4], [0, 0, 0]]


def test_an_unreadable_broker_is_a_gap_not_a_repeated_value() -> None:
    history = LagHistory()
    history.record(report(7, [7]), at=1.0, readable=True)
    history.record(report(7, [7], status="UNKNOWN"), at=3.0, readable=False)
    g = history.to_json()["groups"]["g"]
    assert g["lag"] == [7, None]
    assert g["lag_seconds"] == [1.5, None]
    assert g["status"] == ["OK", "UNKNOWN"]
    assert g["partitions"][0]["lag"] == [7, None]
