"""The metadata service: every stage topic and DLQ -> idempotent upserts in the warehouse.

The offset is committed only after the database transaction commits; a crash in between
replays the record, and the upserts (plus the processed-event ledger) make that harmless.
"""

from __future__ import annotations

import asyncio
import json

from faststream import FastStream
from faststream.confluent.annotations import KafkaMessage
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError

from schemas.events import DLQ_TOPICS, STAGE_TOPICS, TOPIC_METADATA_DLQ, ReasonCode, dlq_topic
from services.common.settings import Settings
from services.common.stage import (
    Consume,
    PermanentError,
    TransientError,
    make_broker,
    subscriber_options,
)
from services.metadata.core import statements_for
from services.metadata.warehouse import make_engine, processed_events

GROUP = "egoline-metadata"


def metadata_dlq_for(topic: str) -> str:
    """Unreadable records of a stage topic go to its DLQ; of a DLQ, to `metadata.dlq`."""
    return TOPIC_METADATA_DLQ if topic.endswith(".dlq") else dlq_topic(topic)


def apply_record(engine: Engine, topic: str, body: bytes, settings: Settings) -> bool:
    """Apply one record in one transaction; returns False when it was applied before."""
    try:
        statements = statements_for(topic, body, settings.split_key, settings.eval_fraction)
        event_id = str(json.loads(body)["event_id"])
    except (ValidationError, ValueError, KeyError, TypeError) as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, str(exc)[:2000]) from exc
    try:
        with engine.begin() as conn:
            first_time = conn.execute(
                insert(processed_events)
                .values(event_id=event_id, topic=topic)
                .on_conflict_do_nothing()
                .returning(processed_events.c.event_id)
            ).first()
            if first_time is None:
                return False
            for statement in statements:
                conn.execute(statement)
    except OperationalError as exc:
        raise TransientError(f"warehouse unavailable: {exc}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise TransientError(f"warehouse connection lost: {exc}") from exc
        raise
    return True


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "metadata")
    engine = make_engine(settings)
    consume = Consume(broker, "metadata", dlq_for=metadata_dlq_for)

    @broker.subscriber(
        *STAGE_TOPICS, *DLQ_TOPICS, title="metadata", **subscriber_options(settings, GROUP)
    )
    async def on_record(msg: KafkaMessage) -> None:
        async def work(topic: str, body: bytes) -> None:
            await asyncio.to_thread(apply_record, engine, topic, body, settings)

        await consume(msg, work)

    app = FastStream(broker)
    app.after_shutdown(engine.dispose)
    return app
