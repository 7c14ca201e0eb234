"""The metadata service: every stage topic and DLQ -> idempotent upserts in the warehouse.

Records arrive in batches; a batch is one transaction with a savepoint per record, and its
offsets are committed only after the transaction commits; a crash in between replays the batch,
and the upserts (plus the processed-event ledger) make that harmless.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from faststream import FastStream
from faststream.confluent.annotations import KafkaMessage
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError

from schemas.events import DLQ_TOPICS, STAGE_TOPICS, TOPIC_METADATA_DLQ, ReasonCode, dlq_topic
from services.common import metrics
from services.common.retry import backoff_delay
from services.common.settings import Settings
from services.common.stage import (
    PermanentError,
    TransientError,
    classify,
    dlq_record,
    make_broker,
    publish_event,
    subscriber_options,
)
from services.metadata.core import Upserts, refresh_manifest_episodes, statements_for
from services.metadata.warehouse import make_engine, processed_events

GROUP = "egoline-metadata"
log = logging.getLogger("egoline.metadata")


def metadata_dlq_for(topic: str) -> str:
    """Unreadable records of a stage topic go to its DLQ; of a DLQ, to `metadata.dlq`."""
    return TOPIC_METADATA_DLQ if topic.endswith(".dlq") else dlq_topic(topic)


def apply_batch(
    engine: Engine, records: list[tuple[str, bytes]], settings: Settings
) -> dict[int, PermanentError]:
    """Apply a batch of records in one transaction (a savepoint each); returns the records
    that could not be applied, by index, with the reason. A record seen before (by event id)
    is skipped. Raises TransientError when the warehouse is unreachable."""
    failures: dict[int, PermanentError] = {}
    parsed: list[tuple[int, str, str, Upserts]] = []
    for i, (topic, body) in enumerate(records):
        try:
            upserts = statements_for(topic, body, settings.split_key, settings.eval_fraction)
            parsed.append((i, topic, str(json.loads(body)["event_id"]), upserts))
        except (ValidationError, ValueError, KeyError, TypeError, RecursionError) as exc:
            failures[i] = PermanentError(ReasonCode.MALFORMED_EVENT, str(exc)[:2000])
        except Exception as exc:
            # Parsing is pure: whatever else it raises is about this record, not the
            # warehouse; dead-letter it rather than rewind the partition onto it forever.
            log.exception("metadata: unexpected error reading a %s record", topic)
            failures[i] = PermanentError(
                ReasonCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"[:2000]
            )
    try:
        with engine.begin() as conn:
            touched: set[str] = set()
            for i, topic, event_id, upserts in parsed:
                savepoint = conn.begin_nested()
                try:
                    first_time = conn.execute(
                        insert(processed_events)
                        .values(event_id=event_id, topic=topic)
                        .on_conflict_do_nothing()
                        .returning(processed_events.c.event_id)
                    ).first()
                    if first_time is not None:
                        for statement in upserts.statements:
                            conn.execute(statement)
                        touched |= upserts.episode_ids
                    savepoint.commit()
                except (IntegrityError, DataError) as exc:
                    savepoint.rollback()
                    failures[i] = PermanentError(ReasonCode.INTERNAL_ERROR, str(exc)[:2000])
            if touched:
                conn.execute(refresh_manifest_episodes(sorted(touched)))
    except OperationalError as exc:
        raise TransientError(f"warehouse unavailable: {exc}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise TransientError(f"warehouse connection lost: {exc}") from exc
        raise
    return failures


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "metadata")
    engine = make_engine(settings)
    rewinds = 0  # consecutive, for the backoff

    @broker.subscriber(
        *STAGE_TOPICS,
        *DLQ_TOPICS,
        title="metadata",
        **subscriber_options(settings, GROUP, batch=True),
    )
    async def on_records(msg: KafkaMessage) -> None:
        nonlocal rewinds
        started = time.perf_counter()
        raw = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        records = [(str(r.topic()), r.value() or b"") for r in raw]
        try:
            failures = await asyncio.to_thread(apply_batch, engine, records, settings)
        except Exception as exc:
            # Transient (warehouse down) or not, never commit past an unapplied batch
            # (faststream issue #2618): rewind and retry; the upserts are idempotent.
            delay = backoff_delay(rewinds, base_s=1.0)
            rewinds += 1
            kind = "transient" if classify(exc).transient else "unexpected"
            log.warning(
                "metadata: %s failure, batch rewound (retry in %.1fs): %s", kind, delay, exc
            )
            metrics.REWINDS.labels("metadata").inc()
            await msg.nack()
            await asyncio.sleep(delay)
            return
        rewinds = 0
        for i, error in failures.items():
            r = raw[i]
            topic = str(r.topic())
            record = dlq_record(
                "metadata",
                topic,
                int(r.partition() or 0),
                int(r.offset() or 0),
                r.key(),
                r.value() or b"",
                error,
            )
            await publish_event(broker, metadata_dlq_for(topic), record, key=record.event_id)
        await msg.ack()
        metrics.RECORDS.labels("metadata", "ok").inc(len(records) - len(failures))
        metrics.RECORDS.labels("metadata", "dead_lettered").inc(len(failures))
        for error in failures.values():
            metrics.FAILURES.labels("metadata", error.code.value).inc()
        metrics.BATCH_SIZE.labels("metadata").observe(len(records))
        metrics.BATCH_SECONDS.labels("metadata").observe(time.perf_counter() - started)

    app = FastStream(broker)
    app.after_shutdown(engine.dispose)
    return app
