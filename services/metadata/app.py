"""The metadata service: every stage topic and DLQ -> idempotent upserts in the warehouse.

It runs on the same consume protocol as the stages (`services/common/consume.py`): `prepare`
parses a record into its statements, there is no work step, and `finish` applies the batch in
one transaction with a savepoint per record. Offsets are committed only after the transaction
commits; a crash in between replays the batch, and the upserts (plus the processed-event
ledger) make that harmless. The warehouse unreachable is a retry; a record it refuses goes
to its topic's DLQ (a DLQ's own unreadable records to `metadata.dlq`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from faststream import FastStream
from faststream.confluent import KafkaBroker
from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError

from schemas.events import (
    DLQ_TOPICS,
    METADATA_TOPICS,
    TOPIC_CONSUMER_STATUS,
    TOPIC_METADATA_DLQ,
    ConsumerStatus,
    DlqRecord,
    ReasonCode,
    dlq_topic,
)
from services.common.consume import BatchConsumer, Finished, NoWork, Publishers, subscribe
from services.common.failpoints import Failpoints
from services.common.settings import Settings
from services.common.stage import (
    Failure,
    Outcome,
    PermanentError,
    TransientError,
    classify,
    make_broker,
)
from services.metadata.core import Upserts, refresh_manifest_episodes, statements_for
from services.metadata.layers import LAYER_VERSIONS_KEY
from services.metadata.warehouse import make_engine, processed_events

GROUP = "egoline-metadata"
log = logging.getLogger("egoline.metadata")


def metadata_dlq_for(topic: str) -> str:
    """Unreadable records of a stage topic go to its DLQ; of a DLQ, to `metadata.dlq`."""
    return TOPIC_METADATA_DLQ if topic.endswith(".dlq") else dlq_topic(topic)


@dataclass(frozen=True)
class ParsedRecord:
    """A record of any stage topic or DLQ, parsed into the warehouse statements it implies."""

    topic: str
    event_id: str
    upserts: Upserts


def parse_record(topic: str, body: bytes, settings: Settings) -> ParsedRecord:
    """The `prepare` step (pure): malformed input is a permanent error."""
    try:
        upserts = statements_for(
            topic, body, settings.split_key, settings.eval_fraction, settings.curation
        )
        return ParsedRecord(topic, str(json.loads(body)["event_id"]), upserts)
    except (ValidationError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise PermanentError(ReasonCode.MALFORMED_EVENT, str(exc)[:2000]) from exc


def apply_records(engine: Engine, parsed: dict[int, ParsedRecord]) -> dict[int, Failure]:
    """The `finish` step: the batch's records in one transaction (a savepoint each), then
    `manifest_episodes` recomputed for every episode they touched; returns the records the
    warehouse refused for good, by index. A record seen before (by event id) is skipped.
    Raises TransientError when the warehouse is unreachable."""
    failures: dict[int, Failure] = {}
    try:
        with engine.begin() as conn:
            touched: set[str] = set()
            for i, record in parsed.items():
                savepoint = conn.begin_nested()
                try:
                    first_time = conn.execute(
                        insert(processed_events)
                        .values(event_id=record.event_id, topic=record.topic)
                        .on_conflict_do_nothing()
                        .returning(processed_events.c.event_id)
                    ).first()
                    if first_time is not None:
                        for statement in record.upserts.statements:
                            conn.execute(statement)
                        touched |= record.upserts.episode_ids
                    savepoint.commit()
                except (IntegrityError, DataError) as exc:
                    savepoint.rollback()
                    failures[i] = _refusal(exc)
            if touched:
                conn.execute(refresh_manifest_episodes(sorted(touched)))
    except OperationalError as exc:
        raise TransientError(f"warehouse unavailable: {exc}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise TransientError(f"warehouse connection lost: {exc}") from exc
        raise
    return failures


def _refusal(exc: IntegrityError | DataError) -> Failure:
    """Why the warehouse refused a record: a layer version that exists with other content is
    a `layer_conflict` (versions are immutable); anything else by the one failure policy."""
    constraint = getattr(getattr(exc.orig, "diag", None), "constraint_name", None)
    if isinstance(exc, IntegrityError) and constraint == LAYER_VERSIONS_KEY:
        return Failure(
            Outcome.DEAD_LETTER,
            ReasonCode.LAYER_CONFLICT,
            "the layer version exists with other content: versions are immutable",
        )
    return classify(exc)


def apply_batch(
    engine: Engine, records: list[tuple[str, bytes]], settings: Settings
) -> dict[int, Failure]:
    """prepare + finish for records outside a consumer (the serial baseline, the replay
    tests): the same functions the service runs; returns every refused record by index."""
    failures: dict[int, Failure] = {}
    parsed: dict[int, ParsedRecord] = {}
    for i, (topic, body) in enumerate(records):
        try:
            parsed[i] = parse_record(topic, body, settings)
        except Exception as exc:
            failures[i] = classify(exc)
    return failures | apply_records(engine, parsed)


def build_consumer(
    settings: Settings, broker: KafkaBroker, engine: Engine
) -> BatchConsumer[ParsedRecord, ParsedRecord]:
    """The metadata service on the consume protocol: no work step, everything in `finish`."""
    dlq_topics = {metadata_dlq_for(t) for t in (*METADATA_TOPICS, *DLQ_TOPICS)}
    return BatchConsumer(
        stage="metadata",
        prepare=lambda topic, body: parse_record(topic, body, settings),
        runner=NoWork(),
        finish=lambda jobs, _results: Finished(failures=apply_records(engine, jobs)),
        publishers=Publishers(
            broker,
            {
                **dict.fromkeys(sorted(dlq_topics), DlqRecord),
                TOPIC_CONSUMER_STATUS: ConsumerStatus,
            },
        ),
        dlq_for=metadata_dlq_for,
        backoff_base_s=1.0,
        step_attempts=settings.batch_step_attempts,
        step_backoff_s=settings.batch_step_backoff_s,
        failpoints=Failpoints.parse(settings.failpoints),
        group=GROUP,
    )


def build_app(settings: Settings) -> FastStream:
    broker = make_broker(settings, "metadata")
    engine = make_engine(settings)
    consumer = build_consumer(settings, broker, engine)
    app = subscribe(settings, broker, consumer, (*METADATA_TOPICS, *DLQ_TOPICS))
    app.after_shutdown(engine.dispose)
    return app
