"""The consume protocol every stage shares: at-least-once, idempotent, dead-letter with a reason.

For each record: run the stage's work; on success publish its output (awaiting the broker's
acknowledgement) and only then commit the offset. A `PermanentError` (bad input) goes to
`<topic>.dlq` with its reason code and the original record, then the offset is committed so the
consumer moves on. Anything transient (object store or broker unreachable) rewinds the
partition to the record and retries it with exponential backoff and jitter: nothing is skipped.

faststream runs with `AckPolicy.MANUAL` because its other policies either commit before the work
(ACK_FIRST) or commit past failures (faststream issue #2618).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from confluent_kafka import KafkaException
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage
from faststream.middlewares import AckPolicy
from minio.error import MinioException, S3Error
from pydantic import BaseModel, ValidationError
from urllib3.exceptions import HTTPError

from schemas.events import DlqRecord, ReasonCode, derive_event_id, dlq_topic
from services.common.kafka import client_config
from services.common.settings import Settings

log = logging.getLogger("egoline.stage")
M = TypeVar("M", bound=BaseModel)

_S3_PERMANENT_CODES = {"NoSuchKey", "NoSuchObject", "NoSuchBucket", "AccessDenied"}


class PermanentError(Exception):
    """Bad input: retrying cannot help. The record goes to the DLQ with this reason."""

    def __init__(self, code: ReasonCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message


class TransientError(Exception):
    """A dependency is unavailable; the record is retried, never skipped."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(
        exc, TransientError | KafkaException | HTTPError | ConnectionError | TimeoutError
    ):
        return True
    if isinstance(exc, S3Error):
        return exc.code not in _S3_PERMANENT_CODES
    return isinstance(exc, MinioException)


def parse_event(body: bytes, model: type[M]) -> M:
    """Validate a record against its event model; malformed input is a permanent error."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, f"not JSON: {exc}") from exc
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
        settings.require("kafka_bootstrap"),
        client_id=f"egoline-{service}",
        config=config,  # type: ignore[arg-type]
        enable_idempotence=True,
        acks="all",
        log_level=logging.WARNING,
        **kwargs,
    )


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
        "ack_policy": AckPolicy.MANUAL,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": settings.kafka_session_timeout_ms,
        "heartbeat_interval_ms": settings.kafka_heartbeat_interval_ms,
        "partition_assignment_strategy": (settings.kafka_assignment_strategy,),
    }


async def publish_event(broker: KafkaBroker, topic: str, event: BaseModel, key: str) -> None:
    """Publish and wait for the broker's acknowledgement (the effect is durable after this)."""
    event_id = str(getattr(event, "event_id", ""))
    await broker.publish(
        event.model_dump_json().encode(),
        topic=topic,
        key=key.encode(),
        headers={"event_id": event_id, "content-type": "application/json"},
    )


def dlq_record(
    stage: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    error: PermanentError,
) -> DlqRecord:
    """The dead-letter envelope: the original record untouched, plus where and why it failed."""
    try:
        original, encoding = value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        original, encoding = base64.b64encode(value).decode(), "base64"
    return DlqRecord(
        event_id=derive_event_id("dlq", stage, topic, str(partition), str(offset)),
        failed_at=datetime.now(UTC),
        stage=stage,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        reason_code=error.code,
        reason=error.message[:4000],
        original_key=key.decode("utf-8", "replace") if key is not None else None,
        original_value=original,
        original_encoding=encoding,
    )


class Consume:
    """Runs the consume protocol around a stage's work function."""

    def __init__(
        self,
        broker: KafkaBroker,
        stage: str,
        max_backoff_s: float = 30.0,
        dlq_for: Callable[[str], str] = dlq_topic,
    ) -> None:
        self.broker = broker
        self.dlq_for = dlq_for
        self.stage = stage
        self.max_backoff_s = max_backoff_s
        self._attempts: dict[tuple[str, int, int], int] = {}
        self.on_result: Callable[[str, str], None] = lambda _stage, _outcome: None

    async def __call__(
        self, msg: KafkaMessage, work: Callable[[str, bytes], Awaitable[None]]
    ) -> None:
        raw = msg.raw_message
        assert not isinstance(raw, tuple)
        topic, partition, offset = (
            str(raw.topic()),
            int(raw.partition() or 0),
            int(raw.offset() or 0),
        )
        where = (topic, partition, offset)
        body = raw.value() or b""
        try:
            await work(topic, body)
        except PermanentError as exc:
            log.warning("%s: %s[%d]@%d -> DLQ %s", self.stage, topic, partition, offset, exc)
            record = dlq_record(self.stage, topic, partition, offset, raw.key(), body, exc)
            await publish_event(self.broker, self.dlq_for(topic), record, key=record.event_id)
            self.on_result(self.stage, f"dlq:{exc.code.value}")
        except Exception as exc:
            if not is_transient(exc):
                # A bug or an input we did not foresee: dead-letter it rather than block the
                # partition forever; the reason keeps the exception for the post-mortem.
                log.exception(
                    "%s: unexpected error on %s[%d]@%d", self.stage, topic, partition, offset
                )
                wrapped = PermanentError(ReasonCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
                record = dlq_record(self.stage, topic, partition, offset, raw.key(), body, wrapped)
                await publish_event(self.broker, self.dlq_for(topic), record, key=record.event_id)
                self.on_result(self.stage, "dlq:internal_error")
            else:
                attempt = self._attempts.get(where, 0) + 1
                self._attempts[where] = attempt
                delay = min(self.max_backoff_s, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                log.warning(
                    "%s: transient failure on %s[%d]@%d (attempt %d, retry in %.1fs): %s",
                    self.stage,
                    topic,
                    partition,
                    offset,
                    attempt,
                    delay,
                    exc,
                )
                await msg.nack()
                await asyncio.sleep(delay)
                return
        self._attempts.pop(where, None)
        await msg.ack()
        self.on_result(self.stage, "ok")
