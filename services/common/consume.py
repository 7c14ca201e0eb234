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

Poison isolation (`finish_batch`): a batch-level step that raises a bug of ours (neither bad
input nor a dependency down) is tried `step_attempts` times with backoff, then bisected: it runs
again on each half of the records, recursively, until the single records whose presence makes
it fail are found. Those are dead-lettered as `internal_error` with the exception type and a
traceback digest; every other record goes through. A dependency failing at any point (before or
during the bisection) rewinds the whole batch instead: an outage is never bisected, so it can
never dead-letter a good episode. While a batch is retried or isolated, the consumer publishes
its state to `egoline.consumer-status`, which the lag monitor reads (a group that rewinds the
same offsets again and again is STALL there, with the reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage
from pydantic import BaseModel

from schemas.events import (
    TOPIC_CONSUMER_STATUS,
    ConsumerState,
    ConsumerStatus,
    PartitionPosition,
    derive_event_id,
    dlq_topic,
)
from services.common import metrics
from services.common.failpoints import Failpoints
from services.common.retry import backoff_delay
from services.common.settings import Settings
from services.common.stage import (
    Failure,
    Outcome,
    PermanentError,
    classify,
    dlq_record,
    internal_error,
    is_transient,
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

    def has(self, topic: str) -> bool:
        return topic in self._by_topic

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
    # Poison isolation: attempts of a failing batch-level step before it is bisected, and the
    # base of the backoff between them (EGOLINE_BATCH_STEP_ATTEMPTS, _BACKOFF_S).
    step_attempts: int = 3
    step_backoff_s: float = 0.5
    # Frees what `run` left for `finish` (the shard stage's spooled clips): called once the
    # batch is done with them (committed, isolated or rewound), never between attempts.
    release: Callable[[dict[int, R]], None] | None = None
    failpoints: Failpoints = field(default_factory=Failpoints)
    group: str = ""  # the consumer group, for `egoline.consumer-status` (default egoline-<stage>)
    _retries: int = 0  # consecutive rewinds, for the backoff
    _status_open: bool = False  # a non-committed status was published since the last commit

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
        await self.commit(msg, records)
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
        try:
            await self.finish_batch(records, jobs, results, outcome)
        finally:
            if self.release is not None and results:
                await asyncio.to_thread(self.release, results)
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
        self,
        records: Sequence[Record],
        jobs: dict[int, J],
        results: dict[int, R],
        outcome: BatchOutcome,
    ) -> None:
        """The batch-level step, with poison isolation (the module's docstring)."""
        reached = sorted(results)
        finished: Finished | None = None
        for attempt in range(1, self.step_attempts + 1):
            try:
                finished = await self._finish_part(records, jobs, results, reached)
                break
            except Exception as exc:
                if self._refused(exc, reached, outcome):
                    return
                log.warning(
                    "%s: batch step finish failed (attempt %d of %d): %s: %s",
                    self.stage,
                    attempt,
                    self.step_attempts,
                    type(exc).__name__,
                    exc,
                )
                if attempt < self.step_attempts:
                    metrics.STEP_RETRIES.labels(self.stage).inc()
                    await self.report_status(
                        ConsumerState.RETRYING,
                        records,
                        f"finish attempt {attempt}/{self.step_attempts}: "
                        f"{type(exc).__name__}: {exc}",
                        attempt,
                    )
                    await asyncio.sleep(backoff_delay(attempt - 1, base_s=self.step_backoff_s))
        if finished is not None:
            outcome.outputs.extend(finished.outputs)
            outcome.failures.update(finished.failures)
            return
        # Every attempt failed with a bug: find the records whose presence makes it fail.
        await self.report_status(
            ConsumerState.ISOLATING,
            records,
            f"finish failed {self.step_attempts} times; bisecting {len(reached)} records",
            self.step_attempts,
        )
        metrics.BISECTIONS.labels(self.stage).inc()
        isolated = BatchOutcome()
        middle = len(reached) // 2
        for half in (reached[:middle], reached[middle:]):
            await self._bisect(records, jobs, results, half, isolated)
            if isolated.retry is not None:
                outcome.retry = isolated.retry
                return
        metrics.ISOLATED.labels(self.stage).inc(
            sum(1 for f in isolated.failures.values() if f.exception_type is not None)
        )
        outcome.outputs.extend(isolated.outputs)
        outcome.failures.update(isolated.failures)

    async def _finish_part(
        self, records: Sequence[Record], jobs: dict[int, J], results: dict[int, R], part: list[int]
    ) -> Finished:
        """`finish` on some of the batch's records, in a thread (batch-level effects block)."""

        def call() -> Finished:
            finished = self.finish({i: jobs[i] for i in part}, {i: results[i] for i in part})
            self.failpoints.check(self.stage, "finish", (records[i].value for i in part))
            return finished

        return await asyncio.to_thread(call)

    def _refused(self, exc: Exception, part: list[int], outcome: BatchOutcome) -> bool:
        """Handle what is not a bug: a dependency down rewinds the batch, bad input refused by
        the batch-level effect dead-letters the records of `part`. True when handled."""
        failure = classify(exc, about_record=False)
        if is_transient(exc):
            outcome.retry = failure
            return True
        if isinstance(exc, PermanentError):
            # The work was refused for good: every record that reached `finish` goes to its
            # DLQ with the reason.
            outcome.failures.update(dict.fromkeys(part, failure))
            return True
        return False

    async def _bisect(
        self,
        records: Sequence[Record],
        jobs: dict[int, J],
        results: dict[int, R],
        part: list[int],
        isolated: BatchOutcome,
    ) -> None:
        if not part or isolated.retry is not None:
            return
        try:
            finished = await self._finish_part(records, jobs, results, part)
        except Exception as exc:
            if self._refused(exc, part, isolated):
                return
            if len(part) == 1:
                (i,) = part
                failure = internal_error(exc, step="finish")
                record = records[i]
                log.error(
                    "%s: %s[%d]@%d isolated: %s",
                    self.stage,
                    record.topic,
                    record.partition,
                    record.offset,
                    failure.message,
                )
                isolated.failures[i] = failure
                return
            middle = len(part) // 2
            await self._bisect(records, jobs, results, part[:middle], isolated)
            await self._bisect(records, jobs, results, part[middle:], isolated)
            return
        isolated.outputs.extend(finished.outputs)
        isolated.failures.update(finished.failures)

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
                exception_type=failure.exception_type,
                traceback_digest=failure.traceback_digest,
            )
            dead.append(Output(self.dlq_for(record.topic), envelope, envelope.event_id))
        await self.publishers.publish(*dead)

    async def commit(self, msg: KafkaMessage, records: Sequence[Record] = ()) -> None:
        self._retries = 0
        metrics.LOCAL_DISK_FAILING.labels(self.stage).set(0)
        metrics.CONSECUTIVE_REWINDS.labels(self.stage).set(0)
        await msg.ack()
        if self._status_open:
            await self.report_status(ConsumerState.COMMITTED, records, "batch committed", 0)
            self._status_open = False

    async def rewind(self, msg: KafkaMessage, records: Sequence[Record], why: Failure) -> None:
        """Seek every partition of the batch back to its first record, then back off."""
        metrics.REWINDS.labels(self.stage).inc()
        if why.disk_errno is not None:
            metrics.LOCAL_DISK_ERRORS.labels(self.stage, why.disk_errno).inc()
            metrics.LOCAL_DISK_FAILING.labels(self.stage).set(1)
        delay = backoff_delay(self._retries, base_s=self.backoff_base_s)
        self._retries += 1
        metrics.CONSECUTIVE_REWINDS.labels(self.stage).set(self._retries)
        log.warning("%s: batch rewound (retry in %.1fs): %s", self.stage, delay, why.message)
        for (topic, partition), offset in rewind_positions(records).items():
            await msg.consumer.seek(topic=topic, partition=partition, offset=offset)
        await self.report_status(ConsumerState.REWINDING, records, why.message, self._retries)
        await asyncio.sleep(delay)

    async def report_status(
        self, state: ConsumerState, records: Sequence[Record], reason: str, count: int
    ) -> None:
        """Publish the consumer's state to `egoline.consumer-status` (for the lag monitor).
        Observability only: if it cannot be published (the broker may be what is down), the
        batch goes on as it would have, and the failure is logged and counted."""
        if not self.publishers.has(TOPIC_CONSUMER_STATUS):
            return
        group = self.group or f"egoline-{self.stage}"
        status = ConsumerStatus(
            event_id=derive_event_id("status", group, uuid.uuid4().hex),
            at=datetime.now(UTC),
            group=group,
            stage=self.stage,
            state=state,
            count=count,
            positions=[
                PartitionPosition(topic=t, partition=p, offset=o)
                for (t, p), o in sorted(rewind_positions(records).items())
            ],
            reason=reason[:2000],
        )
        try:
            await asyncio.wait_for(
                self.publishers.publish(Output(TOPIC_CONSUMER_STATUS, status, group)), timeout=5
            )
        except Exception as exc:
            metrics.STATUS_PUBLISH_FAILURES.labels(self.stage).inc()
            log.warning("%s: consumer status not published: %s", self.stage, exc)
            return
        self._status_open = state is not ConsumerState.COMMITTED

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
