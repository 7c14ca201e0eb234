"""Prometheus metrics every stage exports on `/metrics` (names documented in docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECORDS = Counter(
    "egoline_stage_records_total", "Records a stage finished, by outcome", ["stage", "outcome"]
)
BYTES_READ = Counter(
    "egoline_stage_object_bytes_read_total", "Bytes a stage read from the object store", ["stage"]
)
BATCH_SIZE = Histogram(
    "egoline_stage_batch_records",
    "Records per consumed batch",
    ["stage"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
BATCH_SECONDS = Histogram(
    "egoline_stage_batch_seconds",
    "Wall time to process one batch, consume to commit",
    ["stage"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
MAKESPAN_RATIO = Histogram(
    "egoline_stage_batch_makespan_ratio",
    "Batch wall time over the ideal (busy time spread evenly over the workers used)",
    ["stage"],
    buckets=(1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0),
)


ASSIGNED_PARTITIONS = Gauge(
    "egoline_stage_assigned_partitions",
    "Partitions currently assigned to this process's consumer (0 until the group join is done)",
    ["stage"],
)


def assignment_callbacks(stage: str) -> dict[str, Any]:
    """Consumer rebalance callbacks that keep `egoline_stage_assigned_partitions` current;
    it doubles as the readiness signal (a member with partitions has joined its group)."""

    def assigned(_consumer: Any, partitions: list[Any]) -> None:
        ASSIGNED_PARTITIONS.labels(stage).inc(len(partitions))

    def revoked(_consumer: Any, partitions: list[Any]) -> None:
        ASSIGNED_PARTITIONS.labels(stage).dec(len(partitions))

    return {"on_assign": assigned, "on_revoke": revoked, "on_lost": revoked}


def serve_metrics(port: int | None, host: str) -> None:
    """Expose `/metrics` on host:port (nothing when port is None)."""
    if port is not None:
        start_http_server(port, addr=host)
