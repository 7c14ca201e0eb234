"""The pieces of the consume protocol every stage shares (the protocol is `consume.py`):
error kinds and the failure policy, event parsing, the DLQ envelope, the broker factory and
subscriber options.

At-least-once, idempotent, dead-letter with a reason: a stage publishes its output (awaiting
the broker's acknowledgement) and only then commits the offset. A `PermanentError` (bad input)
goes to `<topic>.dlq` with its reason code and the original record, then the offset is
committed so the consumer moves on. Anything transient (object store, broker or warehouse
unreachable, the local disk full or failing) rewinds the partition and retries with
exponential backoff and jitter (`retry.backoff_delay`). `classify` is that policy, in one place.

faststream runs with `AckPolicy.MANUAL` because its other policies either commit before the work
(ACK_FIRST) or commit past failures (faststream issue #2618).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from confluent_kafka import KafkaException
from faststream.confluent import KafkaBroker
from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.types import DecodedMessage
from minio.error import MinioException, S3Error
from pydantic import BaseModel, ValidationError
from urllib3.exceptions import HTTPError

from schemas.events import DlqRecord, ReasonCode, derive_event_id
from services.common.kafka import client_config
from services.common.settings import Settings

log = logging.getLogger("egoline.stage")
M = TypeVar("M", bound=BaseModel)

_S3_PERMANENT_CODES = {"NoSuchKey", "NoSuchObject", "NoSuchBucket", "AccessDenied"}
# A dead letter keeps at most this much of the original record (base64 grows it by 4/3), so
# the envelope of even a huge poison record fits under Kafka's default 1 MB message limit.
MAX_DLQ_ORIGINAL_BYTES = 256 * 1024
# Events are small (the packet index lives in the object store); Kafka's default message limit.
MAX_EVENT_BYTES = 1_000_000


class PermanentError(Exception):
    """Bad input: retrying cannot help. The record goes to the DLQ with this reason."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class TransientError(Exception):
    """A dependency is unavailable; the record is retried, never skipped."""


# Local-disk errors of the worker's own node (a full spool, a quota, a read-only or failing
# disk, too many open files): our fault, never the episode's, so a retry and never a dead letter.
# EIO only when raised by the OS itself: FFmpeg reports some unreadable input as AVERROR(EIO).
_LOCAL_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EMFILE, errno.ENFILE}


def local_disk_errno(exc: BaseException) -> str | None:
    """The errno name of a local-disk failure (`ENOSPC`, ...), or None."""
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    from_ffmpeg = type(exc).__module__.split(".")[0] == "av"
    if exc.errno in _LOCAL_DISK_ERRNOS or (exc.errno == errno.EIO and not from_ffmpeg):
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return None


def is_transient(exc: BaseException) -> bool:
    """A dependency (object store, broker, warehouse) or the local disk failed: retry."""
    if isinstance(
        exc, TransientError | KafkaException | HTTPError | ConnectionError | TimeoutError
    ):
        return True
    if local_disk_errno(exc) is not None:
        return True
    if isinstance(exc, S3Error):
        return exc.code not in _S3_PERMANENT_CODES
    return isinstance(exc, MinioException)


class JobTimeLimit(Exception):
    """A job ran past `job_time_limit_s` (raised inside the worker by its alarm)."""


class Outcome(StrEnum):
    """What the consume protocol does with a failed record (docs/architecture.md)."""

    RETRY = "retry"  # rewind the batch to it and retry with backoff; nothing is skipped
    DEAD_LETTER = "dead_letter"  # `<topic>.dlq` with a reason code, then move on


@dataclass(frozen=True)
class Failure:
    """A failed job or record as data (exceptions with extra fields don't cross processes
    well): its `outcome`, the reason `code` and a message. `disk_errno` names a local-disk
    failure, which also makes the stage report not ready until a batch succeeds."""

    outcome: Outcome
    code: ReasonCode
    message: str
    disk_errno: str | None = None
    # A bug of ours isolated to one record: the exception's type and a digest of where it was
    # raised (the same bug in two records gives the same digest), carried into the DLQ record.
    exception_type: str | None = None
    traceback_digest: str | None = None

    @property
    def transient(self) -> bool:
        return self.outcome is Outcome.RETRY


def classify(exc: BaseException, *, about_record: bool = True) -> Failure:
    """The one failure policy: what every phase of every stage, the metadata service, the
    agent and the object store do with an exception.

    Bad input (`PermanentError`) and a job over its memory or time limit are dead letters
    with their reason; a dependency or the local disk failing is a retry. Anything else is a
    bug: when it was raised about one record (`about_record`: parsing it, running its job,
    applying it) that record is dead-lettered as `internal_error` with the exception's type,
    so it cannot stall its partition; raised by the consumer itself, about no record in
    particular, it is a retry (rewinding costs nothing, a dead-lettered batch of good
    episodes would be our fault passed on to them)."""
    message = f"{type(exc).__name__}: {exc}"[:2000]
    if isinstance(exc, PermanentError):
        return Failure(Outcome.DEAD_LETTER, exc.code, exc.message)
    if isinstance(exc, JobTimeLimit):
        return Failure(
            Outcome.DEAD_LETTER, ReasonCode.RESOURCE_LIMIT, f"{exc} (EGOLINE_JOB_TIME_LIMIT_S)"
        )
    if isinstance(exc, MemoryError):
        return Failure(
            Outcome.DEAD_LETTER,
            ReasonCode.RESOURCE_LIMIT,
            f"out of memory under the worker's limit (EGOLINE_WORKER_MEMORY_LIMIT_MB): {message}",
        )
    if is_transient(exc):
        return Failure(Outcome.RETRY, ReasonCode.INTERNAL_ERROR, message, local_disk_errno(exc))
    outcome = Outcome.DEAD_LETTER if about_record else Outcome.RETRY
    return Failure(outcome, ReasonCode.INTERNAL_ERROR, message)


def traceback_digest(exc: BaseException) -> tuple[str, str]:
    """A short digest of where `exc` was raised (16 hex digits of sha256 over the exception's
    type and each frame's module file, function and line: stable across machines and runs of
    one build, different for another bug), and the innermost frame as `file:line in function`."""
    frames = traceback.extract_tb(exc.__traceback__)
    parts = [type(exc).__qualname__]
    for frame in frames:
        # The path from the package root on, so the digest does not depend on where the
        # project is installed.
        path = frame.filename.replace("\\", "/")
        for root in ("/services/", "/schemas/", "/tests/", "/site-packages/"):
            if root in path:
                path = root.strip("/") + "/" + path.split(root, 1)[1]
                break
        parts.append(f"{path}:{frame.name}:{frame.lineno}")
    where = parts[-1].rsplit(":", 2) if frames else ["?", "?", "?"]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return digest, f"{where[0]}:{where[2]} in {where[1]}"


def internal_error(exc: BaseException, step: str) -> Failure:
    """The dead letter of a record isolated as the cause of a batch-level step's failure."""
    digest, where = traceback_digest(exc)
    return Failure(
        Outcome.DEAD_LETTER,
        ReasonCode.INTERNAL_ERROR,
        f"batch step {step} fails with this record: {type(exc).__name__}: {exc}"[:1500]
        + f" (isolated by bisection; traceback {digest} at {where})",
        exception_type=type(exc).__name__,
        traceback_digest=digest,
    )


def parse_event(body: bytes, model: type[M]) -> M:
    """Validate a record against its event model; malformed input is a permanent error."""
    if len(body) > MAX_EVENT_BYTES:
        raise PermanentError(
            ReasonCode.MALFORMED_EVENT, f"event of {len(body)} bytes, limit {MAX_EVENT_BYTES}"
        )
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, f"not JSON: {exc}"[:2000]) from exc
    if not isinstance(payload, dict):
        raise PermanentError(ReasonCode.MALFORMED_EVENT, "event is not a JSON object")
    expected = model.model_fields.get("schema_version")
    version = payload.get("schema_version")
    if expected is not None and version != expected.default:
        raise PermanentError(
            ReasonCode.UNKNOWN_SCHEMA_VERSION,
            f"schema_version {version!r}, this consumer reads {expected.default}",
        )
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, str(exc)[:2000]) from exc


def make_broker(settings: Settings, service: str, **kwargs: Any) -> KafkaBroker:
    """The faststream broker of one service: idempotent producer, shared client config."""
    config = {k: v for k, v in client_config(settings).items() if k not in ("bootstrap.servers",)}
    return KafkaBroker(
        settings.require("kafka.bootstrap"),
        client_id=f"egoline-{service}",
        config=config,  # type: ignore[arg-type]
        enable_idempotence=True,
        acks="all",
        log_level=logging.WARNING,
        **kwargs,
    )


async def keep_raw(msg: StreamMessage[Any]) -> DecodedMessage:
    """The subscribers' decoder: no decoding at all. faststream's default decoder runs
    `json.loads` on every record before the handler, and what it raises on hostile input (a
    RecursionError for deeply nested arrays, a JSONDecodeError when the record claims
    `content-type: application/json`) escapes the handler, so the record is never dead-lettered
    and the batch is retried forever. Handlers read `msg.raw_message` and parse it themselves
    (`parse_event`), where every failure becomes a reason code."""
    return msg.body


def subscriber_options(settings: Settings, group_id: str, batch: bool = False) -> dict[str, Any]:
    from services.common.metrics import assignment_callbacks

    extra: dict[str, Any] = assignment_callbacks(group_id.removeprefix("egoline-"))
    if batch:
        extra |= {
            "batch": True,
            "max_records": settings.batch_max_records,
            "polling_interval": settings.batch_wait_s,
        }
    return {
        **extra,
        "group_id": group_id,
        "decoder": keep_raw,
        "ack_policy": AckPolicy.MANUAL,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": settings.kafka.session_timeout_ms,
        "heartbeat_interval_ms": settings.kafka.heartbeat_interval_ms,
        "partition_assignment_strategy": (settings.kafka.assignment_strategy,),
    }


def dlq_record(
    stage: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    error: PermanentError,
    exception_type: str | None = None,
    traceback_digest: str | None = None,
) -> DlqRecord:
    """The dead-letter envelope: the original record untouched, plus where and why it failed."""
    size = len(value)
    truncated = size > MAX_DLQ_ORIGINAL_BYTES
    kept = value[:MAX_DLQ_ORIGINAL_BYTES]
    try:
        original, encoding = kept.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        original, encoding = base64.b64encode(kept).decode(), "base64"
    original_key = key.decode("utf-8", "replace")[:1024] if key is not None else None
    return DlqRecord(
        event_id=derive_event_id("dlq", stage, topic, str(partition), str(offset)),
        failed_at=datetime.now(UTC),
        stage=stage,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        reason_code=error.code,
        reason=error.message[:4000],
        original_key=original_key,
        original_value=original,
        original_encoding=encoding,
        original_size=size if truncated else None,
        original_truncated=truncated,
        exception_type=exception_type,
        traceback_digest=traceback_digest,
    )
