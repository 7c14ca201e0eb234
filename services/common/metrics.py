"""Prometheus metrics every stage exports on `/metrics` (names documented in docs/metrics.md),
and the stage's HTTP endpoint: /metrics, /healthz, /readyz."""

from __future__ import annotations

from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from services.common.health import Liveness, metrics_route, start_http, text

RECORDS = Counter(
    "egoline_stage_records_total", "Records a stage finished, by outcome", ["stage", "outcome"]
)
FAILURES = Counter(
    "egoline_stage_failures_total",
    "Records dead-lettered, by reason code (the `reason_code` of the DLQ record)",
    ["stage", "reason"],
)
REWINDS = Counter(
    "egoline_stage_batch_rewinds_total",
    "Batches rewound for a retry after a transient failure (dependency down, worker died)",
    ["stage"],
)
STEP_RETRIES = Counter(
    "egoline_stage_step_retries_total",
    "Retries of a batch-level step (finish) that failed with a bug, before bisecting",
    ["stage"],
)
BISECTIONS = Counter(
    "egoline_stage_bisections_total",
    "Batches bisected after their batch-level step failed every attempt",
    ["stage"],
)
ISOLATED = Counter(
    "egoline_stage_isolated_records_total",
    "Records found by bisection to make a batch-level step fail (dead-lettered internal_error)",
    ["stage"],
)
CONSECUTIVE_REWINDS = Gauge(
    "egoline_stage_consecutive_rewinds",
    "Rewinds since the last committed batch (the same offsets retried again and again)",
    ["stage"],
)
STATUS_PUBLISH_FAILURES = Counter(
    "egoline_stage_status_publish_failures_total",
    "Consumer-status events that could not be published (the batch went on regardless)",
    ["stage"],
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
LOCAL_DISK_ERRORS = Counter(
    "egoline_stage_local_disk_errors_total",
    "Batches rewound because the local disk failed (ENOSPC, EDQUOT, EROFS, EIO, EMFILE), by errno",
    ["stage", "errno"],
)
LOCAL_DISK_FAILING = Gauge(
    "egoline_stage_local_disk_failing",
    "1 from a local-disk failure until the next batch succeeds (readiness is false meanwhile)",
    ["stage"],
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


def assigned_partitions(stage: str) -> float:
    """This process's `egoline_stage_assigned_partitions` for `stage` (0 before any join)."""
    return REGISTRY.get_sample_value("egoline_stage_assigned_partitions", {"stage": stage}) or 0.0


def readiness(stage: str, liveness: Liveness) -> tuple[int, str, bytes]:
    """/readyz of a stage: alive, holding partitions, and its local disk not failing."""
    disk = REGISTRY.get_sample_value("egoline_stage_local_disk_failing", {"stage": stage})
    if disk:
        return text(False, "", "not ready: the local disk is failing (see the stage's log)")
    return text(
        liveness.alive() and assigned_partitions(stage) > 0,
        "ready",
        "not ready: no partitions assigned (group join pending or broker unreachable)",
    )


def serve_stage_http(
    port: int | None, host: str, stage: str, liveness: Liveness
) -> ThreadingHTTPServer | None:
    """Expose /metrics, /healthz (the stage's event loop is beating) and /readyz (alive and
    holding partitions) on host:port; nothing when port is None."""
    if port is None:
        return None
    return start_http(
        host,
        port,
        {
            "/metrics": metrics_route(),
            "/healthz": lambda: text(
                liveness.alive(), "ok", f"event loop silent for {liveness.silence_s():.0f}s"
            ),
            "/readyz": lambda: readiness(stage, liveness),
        },
    )
