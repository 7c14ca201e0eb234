"""The lag report of `LagMonitor` on plain readings: every pipeline group is listed, a group
that never committed counts from the log start and is not OK while its records wait, and a
group whose consumer keeps rewinding one batch is STALL with the reason."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas.events import (
    TOPIC_VALIDATED,
    ConsumerState,
    ConsumerStatus,
    PartitionPosition,
)
from services.lag.collector import PartitionOffsets
from services.lag.evaluator import Status
from services.lag.monitor import PIPELINE_GROUPS, LagMonitor, report_json, watched_groups

SHARD = "egoline-shard"


def never(end: int, at: float, partition: int = 0) -> PartitionOffsets:
    return PartitionOffsets(SHARD, TOPIC_VALIDATED, partition, 0, end, at, never_committed=True)


def status(state: ConsumerState, count: int, offset: int = 4) -> ConsumerStatus:
    return ConsumerStatus(
        event_id="0" * 32,
        at=datetime.now(UTC),
        group=SHARD,
        stage="shard",
        state=state,
        count=count,
        positions=[PartitionPosition(topic=TOPIC_VALIDATED, partition=0, offset=offset)],
        reason="KeyError: 'ep_00000.mp4'",
    )


def test_every_pipeline_group_is_listed_before_any_reading() -> None:
    monitor = LagMonitor(groups=tuple(watched_groups(["extra"])))
    report = monitor.report(now=0.0)
    assert set(report) == {*PIPELINE_GROUPS, "extra"}
    assert all(entry.status is Status.UNKNOWN for entry in report.values())
    assert "topics do not exist" in report[SHARD].reason


def test_a_group_that_never_committed_counts_from_the_log_start_and_stalls() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe([never(12, 0.0)])
    first = monitor.report(now=1.0)[SHARD]
    assert first.status is Status.WARN and first.never_committed
    assert first.partitions[0].lag == 12
    monitor.observe([never(12, 2.0)])
    later = monitor.report(now=3.0)[SHARD]
    assert later.partitions[0].status is Status.STALL and later.status is Status.ERR
    assert later.reason == "never committed: 12 records waiting from the log start"
    doc = report_json(monitor.report(now=3.0))[SHARD]
    assert doc["never_committed"] is True and doc["partitions"][0]["never_committed"] is True


def test_a_group_that_never_committed_on_an_empty_partition_is_ok() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    for at in (0.0, 2.0, 4.0):
        monitor.observe([never(0, at)])
    entry = monitor.report(now=5.0)[SHARD]
    assert entry.status is Status.OK and entry.reason == ""


def test_the_first_commit_ends_never_committed() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe([never(12, 0.0)])
    monitor.observe([never(12, 2.0)])
    monitor.observe([PartitionOffsets(SHARD, TOPIC_VALIDATED, 0, 12, 12, 4.0)])
    entry = monitor.report(now=5.0)[SHARD]
    assert entry.status is Status.OK and not entry.never_committed and entry.reason == ""


def committed_at(offset: int, end: int = 20) -> list[PartitionOffsets]:
    return [PartitionOffsets(SHARD, TOPIC_VALIDATED, 0, offset, end, 0.0)]


def test_a_group_rewinding_one_batch_again_and_again_is_stall_with_the_reason() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe(committed_at(4))
    monitor.observe_status({SHARD: status(ConsumerState.REWINDING, 3)})
    entry = monitor.report(now=0.5)[SHARD]
    assert entry.partitions[0].status is Status.STALL
    assert entry.status is Status.ERR
    assert entry.reason == "rewound the same batch 3 times: KeyError: 'ep_00000.mp4'"
    assert entry.consumer_state == "rewinding"


def test_one_rewind_is_not_a_stall() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe(committed_at(4))
    monitor.observe_status({SHARD: status(ConsumerState.REWINDING, 1)})
    assert monitor.report(now=0.5)[SHARD].reason == ""


def test_a_group_isolating_a_poison_record_says_so() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe(committed_at(4))
    monitor.observe_status({SHARD: status(ConsumerState.ISOLATING, 3)})
    entry = monitor.report(now=0.5)[SHARD]
    assert entry.reason.startswith("bisecting a batch")
    assert entry.partitions[0].status is Status.STALL


def test_a_stall_ends_when_the_group_commits_past_the_batch_or_reports_committed() -> None:
    monitor = LagMonitor(groups=(SHARD,))
    monitor.observe(committed_at(4))
    monitor.observe_status({SHARD: status(ConsumerState.REWINDING, 5)})
    monitor.observe(committed_at(9))
    assert monitor.report(now=0.5)[SHARD].reason == ""
    monitor.observe(committed_at(4))
    monitor.observe_status({SHARD: status(ConsumerState.COMMITTED, 0)})
    assert monitor.report(now=0.5)[SHARD].reason == ""
