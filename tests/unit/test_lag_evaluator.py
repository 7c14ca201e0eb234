"""Burrow's rules and lag-in-seconds interpolation, on plain data."""

from __future__ import annotations

import pytest

from services.lag.evaluator import (
    Observation,
    Status,
    evaluate_group,
    evaluate_partition,
    lag_seconds,
    partition_lag,
)


def window(offsets: list[int], lags: list[int | None], step: float = 10.0) -> list[Observation]:
    return [
        Observation(i * step, o, lag) for i, (o, lag) in enumerate(zip(offsets, lags, strict=True))
    ]


NOW = 95.0  # just after the last of 10 observations taken every 10 s


def test_any_zero_lag_in_the_window_is_ok() -> None:
    assert evaluate_partition(window([1, 2, 3], [5, 0, 7]), NOW) is Status.OK


def test_committed_offset_going_backwards_is_rewind() -> None:
    assert evaluate_partition(window([10, 20, 15, 30], [5, 6, 7, 8]), 35) is Status.REWIND


def test_no_commit_for_longer_than_the_window_spans_is_stop() -> None:
    obs = window([10, 20, 30], [5, 5, 5])  # commits at 0, 10, 20 s
    assert evaluate_partition(obs, now=25.0) is not Status.STOP
    assert evaluate_partition(obs, now=41.0) is Status.STOP  # 21 s idle > 20 s span


def test_same_offset_while_lagging_is_stall() -> None:
    assert evaluate_partition(window([7] * 5, [3, 4, 5, 6, 7]), 45) is Status.STALL


def test_lag_never_decreasing_is_warn() -> None:
    assert evaluate_partition(window([1, 2, 3, 4], [5, 5, 6, 9]), 35) is Status.WARN


def test_consumer_catching_up_is_ok() -> None:
    assert evaluate_partition(window([1, 5, 9, 13], [9, 7, 8, 4]), 35) is Status.OK


def test_unknown_lag_is_unknown_not_negative() -> None:
    assert partition_lag(committed=10, end=1) is None
    assert partition_lag(committed=10, end=12) == 2
    assert evaluate_partition(window([10, 10], [None, 2]), 15) is Status.UNKNOWN


@pytest.mark.parametrize(
    ("statuses", "group"),
    [
        ([Status.OK, Status.OK], Status.OK),
        ([Status.OK, Status.WARN], Status.WARN),
        ([Status.WARN, Status.STALL], Status.ERR),
        ([Status.OK, Status.STOP], Status.ERR),
        ([Status.REWIND], Status.ERR),
        ([], Status.UNKNOWN),
    ],
)
def test_group_is_its_worst_partition_clamped_to_err(statuses: list[Status], group: Status) -> None:
    assert evaluate_group(statuses) is group


def test_lag_seconds_interpolates_between_samples() -> None:
    samples = [(100, 1000.0), (200, 1010.0), (300, 1020.0)]
    assert lag_seconds(250, samples, now=1030.0) == pytest.approx(15.0)  # 250 was the end at 1015
    assert lag_seconds(300, samples, now=1030.0) == 0.0
    assert lag_seconds(50, samples, now=1030.0) == pytest.approx(35.0)  # extrapolated to 995
    assert lag_seconds(10, [], now=1.0) is None


def test_a_burst_after_a_quiet_spell_is_timed_from_the_end_of_the_spell() -> None:
    from services.lag.collector import PartitionOffsets
    from services.lag.monitor import LagMonitor

    monitor = LagMonitor()
    # the topic sits at offset 0 for 100 s, then 30 records arrive between polls at 100 and 102
    for at in range(0, 101, 2):
        monitor.observe([PartitionOffsets("g", "t", 0, committed=0, end=0, at=float(at))])
    monitor.observe([PartitionOffsets("g", "t", 0, committed=0, end=30, at=102.0)])
    (partition,) = monitor.report(now=110.0)["g"].partitions
    assert partition.lag == 30
    # offset 0 was last the log end at 100 s: 10 s behind, not 110 s (the whole quiet spell)
    assert partition.lag_seconds == pytest.approx(10.0)
