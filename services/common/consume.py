"""The one consume protocol: every stage and the metadata service run a batch of records
through the same named steps (docs/architecture.md, "The consume protocol"):

    decode records -> prepare -> run -> finish -> publish outcomes -> commit
                          \\________ any RETRY ________/
                                      -> rewind (seek back to the batch, backoff)

- `decode_records`: the broker's batch as plain `Record`s.
- `prepare(topic, value) -> job | None` (pure, per record): parse and check the event.
- `run(jobs)`: the work, per job, through a `JobRunner` (a process pool for the media stages,
  nothing for the metadata service).
- `finish(jobs, results) -> Finished`: batch-level effects (pack shards, one warehouse
  transaction), outputs to publish, and per-record failures.
- `publish outcomes`: outputs, then dead letters, each awaited until the broker acknowledged
  it (through faststream publisher objects declared up front, so tests read `publisher.mock`).
- `commit`: the batch's offsets, only after all of the above is durable.

Every failure of every step goes through `stage.classify` -> RETRY or DEAD_LETTER. A RETRY
anywhere rewinds the whole batch (every effect is idempotent, so redoing what succeeded is
harmless); a DEAD_LETTER costs only its own record (or, when `finish` rejects the batch's
work for good, the records that reached it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage
from pydantic import BaseModel

from schemas.events import dlq_topic
from services.common import metrics
from services.common.retry import backoff_delay
from services.common.settings import Settings
from services.common.stage import (
    Failure,
    Outcome,
    PermanentError,
    classify,
    dlq_record,
    subscriber_options,
)

log = logging.getLogger("egoline.consume")
J = TypeVar("J")
R = TypeVar("R")


@dataclass(frozen=True)
class Record:
    """One consumed Kafka record, as plain data."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class Output:
    """An event a stage publishes: to `topic`, keyed by `key` (the partitioning key)."""

    topic: str
    event: BaseModel
    key: str


@dataclass(frozen=True)
class Finished:
    """What `finish` hands back: the outputs to publish, in order, and the records (by batch
    index) whose effect failed for good."""

    outputs: Sequence[Output] = ()
    failures: Mapping[int, Failure] = field(default_factory=dict)


@dataclass
class BatchOutcome:
    """The result of the work steps for one batch: either `retry` (rewind) or outputs and
    dead letters to publish before the commit."""

    outputs: list[Output] = field(default_factory=list)
    failures: dict[int, Failure] = field(default_factory=dict)
    retry: Failure | None = None


class JobRunner(Protocol[J, R]):
    """The `run` step: each job's result, or its `Failure` (as data, not raised)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    async def run(self, jobs: dict[int, J]) -> dict[int, R | Failure]: ...


class NoWork(Generic[J]):
    """The runner of a service whose work all happens in `finish` (the metadata service):
    each job is its own result."""

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    async def run(self, jobs: dict[int, J]) -> dict[int, J | Failure]:
        return dict(jobs)


def decode_records(msg: KafkaMessage) -> list[Record]:
    """The batch behind a faststream message (a tuple from the real consumer, a list from
    `TestKafkaBroker`, one record for a non-batch subscriber)."""
    raw = msg.raw_message
    records = raw if isinstance(raw, tuple | list) else (raw,)
    return [
        Record(
            topic=str(r.topic()),
            partition=int(r.partition() or 0),
            offset=int(r.offset() or 0),
            key=r.key(),
            value=r.value() or b"",
        )
        for r in records
    ]


def rewind_positions(records: Iterable[Record]) -> dict[tuple[str, int], int]:
    """Where each partition of a batch must be sought back to: its earliest record, so no
    partition is ever committed past a record that was not processed."""
    earliest: dict[tuple[str, int], int] = {}
    for record in records:
        at = (record.topic, record.partition)
        earliest[at] = min(record.offset, earliest.get(at, record.offset))
    return earliest


class Publishers:
    """faststream publisher objects, one per topic a service may write (declared up front:
    they appear in the AsyncAPI document, and `publisher.mock` in `TestKafkaBroker`)."""

    def __init__(self, broker: KafkaBroker, schemas: Mapping[str, type[BaseModel] | None]) -> None:
        self._by_topic = {
            topic: broker.publisher(topic, title=topic, schema=schema)
            for topic, schema in schemas.items()
        }

    def __getitem__(self, topic: str) -> Any:
        return self._by_topic[topic]

    async def publish(self, *outputs: Output) -> None:
        """Produce each output in order (so outputs with one key keep their order in its
        partition), then wait until the broker acknowledged every one of them: one round trip
        for the lot, and the effect is durable when this returns."""
        pending: list[asyncio.Future[Any]] = []
        for output in outputs:
            try:
                publisher = self._by_topic[output.topic]
            except KeyError:
                raise ValueError(f"no publisher declared for topic {output.topic!r}") from None
            ack = await publisher.publish(
                output.event.model_dump_json().encode(),
                key=output.key.encode(),
                headers={
                    "event_id": str(getattr(output.event, "event_id", "")),
                    "content-type": "application/json",
                },
                no_confirm=True,
            )
            if ack is not None:  # TestKafkaBroker delivers at once and returns nothing
                pending.append(ack)
        await asyncio.gather(*pending)


@dataclass
class BatchConsumer(Generic[J, R]):
    """The protocol for one service: `consume(msg)` is the subscriber's whole body."""

    stage: str
    prepare: Callable[[str, bytes], J | None]
    runner: JobRunner[J, R]
    finish: Callable[[dict[int, J], dict[int, R]], Finished]
    publishers: Publishers
    dlq_for: Callable[[str], str] = dlq_topic
    backoff_base_s: float = 0.5
    _retries: int = 0  # consecutive rewinds, for the backoff

    async def consume(self, msg: KafkaMessage) -> None:
        started = time.perf_counter()
        records = decode_records(msg)
        try:
            outcome = await self.work(records)
            if outcome.retry is None:
                await self.publish_outcomes(records, outcome)
        except Exception as exc:
            # Raised by the protocol itself (a publish that failed, a bug in finish): never
            # leave the batch un-acknowledged and move on, a later commit would skip it
            # (faststream issue #2618). The batch as a whole is retried.
            log.exception("%s: batch failed", self.stage)
            failure = classify(exc, about_record=False)
            outcome = BatchOutcome(retry=replace(failure, outcome=Outcome.RETRY))
        if outcome.retry is not None:
            await self.rewind(msg, records, outcome.retry)
            return
        await self.commit(msg)
        self.observe(records, outcome, time.perf_counter() - started)

    async def work(self, records: Sequence[Record]) -> BatchOutcome:
        """prepare -> run -> finish: pure of the broker, so the steps are tested without one."""
        outcome = BatchOutcome()
        jobs = self.prepare_records(records, outcome)
        if outcome.retry is not None or not jobs:
            return outcome
        results = await self.run_jobs(jobs, outcome)
        if outcome.retry is not None:
            return outcome
        await self.finish_batch(jobs, results, outcome)
        return outcome

    def prepare_records(self, records: Sequence[Record], outcome: BatchOutcome) -> dict[int, J]:
        jobs: dict[int, J] = {}
        for i, record in enumerate(records):
            try:
                job = self.prepare(record.topic, record.value)
            except Exception as exc:
                failure = classify(exc)
                if failure.outcome is Outcome.RETRY:
                    outcome.retry = failure
                    return {}
                if not isinstance(exc, PermanentError):
                    log.exception("%s: preparing %s@%d failed", self.stage, record.topic, i)
                outcome.failures[i] = failure
                continue
            if job is not None:
                jobs[i] = job
        return jobs

    async def run_jobs(self, jobs: dict[int, J], outcome: BatchOutcome) -> dict[int, R]:
        results: dict[int, R] = {}
        for i, result in (await self.runner.run(jobs)).items():
            if isinstance(result, Failure):
                if result.outcome is Outcome.RETRY:
                    outcome.retry = result
                    return {}
                outcome.failures[i] = result
            else:
                results[i] = result
        return results

    async def finish_batch(
        self, jobs: dict[int, J], results: dict[int, R], outcome: BatchOutcome
    ) -> None:
        # In a thread: batch-level effects block (object store, warehouse).
        try:
            finished = await asyncio.to_thread(self.finish, {i: jobs[i] for i in results}, results)
        except Exception as exc:
            failure = classify(exc, about_record=False)
            if failure.outcome is Outcome.RETRY:
                outcome.retry = failure
            else:
                # The batch's work was refused for good (a PermanentError from a batch-level
                # effect): every record that reached `finish` goes to its DLQ with the reason.
                outcome.failures.update({i: failure for i in results})
            return
        outcome.outputs.extend(finished.outputs)
        outcome.failures.update(finished.failures)

    async def publish_outcomes(self, records: Sequence[Record], outcome: BatchOutcome) -> None:
        await self.publishers.publish(*outcome.outputs)
        dead: list[Output] = []
        for i in sorted(outcome.failures):
            record, failure = records[i], outcome.failures[i]
            error = PermanentError(failure.code, failure.message)
            log.warning(
                "%s: %s[%d]@%d -> DLQ %s",
                self.stage,
                record.topic,
                record.partition,
                record.offset,
                error,
            )
            envelope = dlq_record(
                self.stage,
                record.topic,
                record.partition,
                record.offset,
                record.key,
                record.value,
                error,
            )
            dead.append(Output(self.dlq_for(record.topic), envelope, envelope.event_id))
        await self.publishers.publish(*dead)

    async def commit(self, msg: KafkaMessage) -> None:
        self._retries = 0
        metrics.LOCAL_DISK_FAILING.labels(self.stage).set(0)
        await msg.ack()

    async def rewind(self, msg: KafkaMessage, records: Sequence[Record], why: Failure) -> None:
        """Seek every partition of the batch back to its first record, then back off."""
        metrics.REWINDS.labels(self.stage).inc()
        if why.disk_errno is not None:
            metrics.LOCAL_DISK_ERRORS.labels(self.stage, why.disk_errno).inc()
            metrics.LOCAL_DISK_FAILING.labels(self.stage).set(1)
        delay = backoff_delay(self._retries, base_s=self.backoff_base_s)
        self._retries += 1
        log.warning("%s: batch rewound (retry in %.1fs): %s", self.stage, delay, why.message)
        for (topic, partition), offset in rewind_positions(records).items():
            await msg.consumer.seek(topic=topic, partition=partition, offset=offset)
        await asyncio.sleep(delay)

    def observe(self, records: Sequence[Record], outcome: BatchOutcome, seconds: float) -> None:
        for failure in outcome.failures.values():
            metrics.FAILURES.labels(self.stage, failure.code.value).inc()
        metrics.BATCH_SIZE.labels(self.stage).observe(len(records))
        metrics.BATCH_SECONDS.labels(self.stage).observe(seconds)
        metrics.RECORDS.labels(self.stage, "dead_lettered").inc(len(outcome.failures))
        metrics.RECORDS.labels(self.stage, "ok").inc(len(records) - len(outcome.failures))


def subscribe(
    settings: Settings,
    broker: KafkaBroker,
    consumer: BatchConsumer[Any, Any],
    topics: tuple[str, ...],
) -> FastStream:
    """The faststream app of a service on the protocol: its batch subscriber (own consumer
    group `egoline-<stage>`, manual commits) and its runner's lifetime."""

    @broker.subscriber(
        *topics,
        title=consumer.stage,
        **subscriber_options(settings, f"egoline-{consumer.stage}", batch=True),
    )
    async def handle_batch(msg: KafkaMessage) -> None:
        await consumer.consume(msg)

    app = FastStream(broker)
    app.on_startup(consumer.runner.start)
    app.after_shutdown(consumer.runner.stop)
    return app
