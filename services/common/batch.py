"""Batched stages: a batch of records -> jobs bin-packed onto worker processes -> outputs.

The delivery rules of `stage`, per batch: outputs (and dead letters) are published
and acknowledged by the broker, in record order, before the batch's offsets are committed; a
transient failure anywhere rewinds the whole batch (every effect is idempotent, so redoing the
records that had succeeded is harmless).

Work runs in a process pool (`spawn`: no fork after librdkafka threads start). Each worker
process builds its own object store client once (`init_worker`). A stage provides:
- `prepare(topic, value) -> Job` (pure, in the consumer process; raises PermanentError),
- `cost(job) -> float` (for the bin-packing),
- `run(job) -> Result` (a top-level function, run in a worker process),
- `finish(jobs, results) -> [(topic, event, key)]` (in the consumer process, in a thread: the
  place for batch-level effects such as packing clips of many episodes into shards).
`prepare` may return None for a record that needs no work (it is simply acknowledged).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from faststream import FastStream
from faststream.confluent import KafkaBroker
from faststream.confluent.annotations import KafkaMessage
from pydantic import BaseModel

from schemas.events import ReasonCode, dlq_topic
from services.common import metrics
from services.common.limits import apply_memory_limit, time_limit
from services.common.objectstore import ObjectStore, object_store
from services.common.rawcache import RawCache, fetch_raw
from services.common.retry import backoff_delay
from services.common.scheduling import Ramp, lpt_assign, makespan_ratio
from services.common.scratch import sweep_dead
from services.common.settings import Settings
from services.common.stage import (
    Failure,
    PermanentError,
    classify,
    dlq_record,
    publish_event,
    subscriber_options,
)

log = logging.getLogger("egoline.batch")
J = TypeVar("J")
R = TypeVar("R")

_WORKER_STORE: ObjectStore | None = None
_WORKER_CACHE: RawCache | None = None


def init_worker(settings: Settings) -> None:
    """Per worker process: its memory limit, then one object store client (and raw cache),
    reused for every job."""
    global _WORKER_STORE, _WORKER_CACHE
    apply_memory_limit(settings.worker_memory_limit_mb)
    sweep_dead()
    sweep_dead(settings.spool_path)
    _WORKER_STORE = object_store(settings)
    if settings.raw_cache_dir is not None:
        _WORKER_CACHE = RawCache(settings.raw_cache_dir, settings.raw_cache_mb * 1024 * 1024)


def worker_fetch_raw(key: str, dest: Path) -> None:
    """Materialise a raw object locally, through the node-local cache when configured."""
    fetch_raw(worker_store(), _WORKER_CACHE, key, dest)


def worker_store() -> ObjectStore:
    if _WORKER_STORE is None:
        raise RuntimeError("worker process not initialised")
    return _WORKER_STORE


def run_jobs(
    run: Callable[[Any], Any], jobs: list[Any], time_limit_s: float = 0.0
) -> tuple[list[Any], float, int]:
    """One worker's share of a batch, in order, each job under the time limit; returns
    (results or `Failure`s, busy seconds, object bytes read)."""
    started = time.perf_counter()
    store = _WORKER_STORE
    read_before = store.bytes_read if store is not None else 0
    results: list[Any] = []
    for job in jobs:
        try:
            with time_limit(time_limit_s):
                results.append(run(job))
        except Exception as exc:
            failure = classify(exc)
            if failure.code is ReasonCode.INTERNAL_ERROR and not failure.transient:
                log.exception("job failed")
            results.append(failure)
    read = (store.bytes_read - read_before) if store is not None else 0
    return results, time.perf_counter() - started, read


@dataclass
class BatchStage(Generic[J, R]):
    broker: KafkaBroker
    stage: str
    settings: Settings
    workers: int
    prepare: Callable[[str, bytes], J | None]
    cost: Callable[[J], float]
    run: Callable[[J], R]
    finish: Callable[[dict[int, J], dict[int, R]], Sequence[tuple[str, BaseModel, str]]]
    _pool: ProcessPoolExecutor | None = None
    _ramp: Ramp | None = None
    _failures: int = 0

    def start(self) -> None:
        self._pool = self._new_pool()
        self._ramp = Ramp(self.workers)

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_worker,
            initargs=(self.settings,),
        )

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    async def __call__(self, msg: KafkaMessage) -> None:
        try:
            await self._consume(msg)
        except Exception:
            # Never leave a batch un-acknowledged and move on: a later commit would skip it
            # (faststream issue #2618). Rewind to it and retry; every effect is idempotent.
            log.exception("%s: batch failed unexpectedly; rewinding to retry it", self.stage)
            self._failures += 1
            metrics.REWINDS.labels(self.stage).inc()
            await msg.nack()
            await asyncio.sleep(backoff_delay(self._failures))

    async def _consume(self, msg: KafkaMessage) -> None:
        started = time.perf_counter()
        raw = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        records = [
            (
                str(r.topic()),
                int(r.partition() or 0),
                int(r.offset() or 0),
                r.key(),
                r.value() or b"",
            )
            for r in raw
        ]
        jobs: dict[int, J] = {}
        failures: dict[int, Failure] = {}
        for i, (topic, _, _, _, value) in enumerate(records):
            try:
                job = self.prepare(topic, value)
            except Exception as exc:
                # `prepare` is pure parsing: an unexpected error is about this record, so it
                # is dead-lettered instead of rewinding the partition onto it forever.
                failure = classify(exc)
                if failure.transient:
                    raise
                if failure.code is ReasonCode.INTERNAL_ERROR:
                    log.exception("%s: preparing %s@%d failed", self.stage, topic, i)
                failures[i] = failure
                continue
            if job is not None:
                jobs[i] = job
        results: dict[int, R] = {}
        if jobs:
            done, transient = await self._run_jobs(jobs)
            if transient is None:
                for i, outcome in done.items():
                    if isinstance(outcome, Failure):
                        failures[i] = outcome
                    else:
                        results[i] = outcome
                try:
                    outputs = await asyncio.to_thread(
                        self.finish, {i: jobs[i] for i in results}, results
                    )
                except Exception as exc:
                    failure = classify(exc)
                    if failure.transient:
                        transient = failure
                    elif isinstance(exc, PermanentError):
                        # A batch-level effect failed for good: dead-letter the batch's records.
                        for i in results:
                            failures[i] = failure
                        outputs = []
                    else:
                        raise  # unexpected, in the consumer itself: rewind (`__call__`)
            if transient is not None:
                self._failures += 1
                metrics.REWINDS.labels(self.stage).inc()
                if transient.disk_errno is not None:
                    metrics.LOCAL_DISK_ERRORS.labels(self.stage, transient.disk_errno).inc()
                    metrics.LOCAL_DISK_FAILING.labels(self.stage).set(1)
                delay = backoff_delay(self._failures - 1)
                log.warning(
                    "%s: transient failure, batch rewound (retry in %.1fs): %s",
                    self.stage,
                    delay,
                    transient.message,
                )
                await msg.nack()
                await asyncio.sleep(delay)
                return
            # All produced at once (in order: the idempotent producer keeps per-partition order),
            # then awaited together: one round trip per batch, not one per event.
            await asyncio.gather(
                *(publish_event(self.broker, t, event, key=k) for t, event, k in outputs)
            )
        for i, (topic, partition, offset, key, value) in enumerate(records):
            if i not in failures:
                continue
            failure = failures[i]
            error = PermanentError(failure.code, failure.message)
            log.warning("%s: %s[%d]@%d -> DLQ %s", self.stage, topic, partition, offset, error)
            record = dlq_record(self.stage, topic, partition, offset, key, value, error)
            await publish_event(self.broker, dlq_topic(topic), record, key=record.event_id)
        self._failures = 0
        metrics.LOCAL_DISK_FAILING.labels(self.stage).set(0)
        await msg.ack()
        for failure in failures.values():
            metrics.FAILURES.labels(self.stage, failure.code.value).inc()
        metrics.BATCH_SIZE.labels(self.stage).observe(len(records))
        metrics.BATCH_SECONDS.labels(self.stage).observe(time.perf_counter() - started)
        metrics.RECORDS.labels(self.stage, "dead_lettered").inc(len(failures))
        metrics.RECORDS.labels(self.stage, "ok").inc(len(records) - len(failures))

    async def _run_jobs(self, jobs: dict[int, J]) -> tuple[dict[int, R | Failure], Failure | None]:
        assert self._pool is not None and self._ramp is not None
        indexes = list(jobs)
        width = self._ramp.next_width()
        plan = lpt_assign([self.cost(jobs[i]) for i in indexes], width)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            futures = [
                loop.run_in_executor(
                    self._pool,
                    run_jobs,
                    self.run,
                    [jobs[indexes[j]] for j in share],
                    self.settings.job_time_limit_s,
                )
                for share in plan
            ]
            shares = await asyncio.gather(*futures)
        except BrokenProcessPool as exc:
            # A worker died (killed, out of memory): a broken pool stays broken, so start a
            # fresh one (with the ramp from one worker) and have the batch retried.
            log.error("%s: worker pool broke (%s); restarting it", self.stage, exc)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            self._ramp = Ramp(self.workers)
            return {}, Failure(True, ReasonCode.INTERNAL_ERROR, f"worker pool broke: {exc}")
        wall = time.perf_counter() - started
        ratio = makespan_ratio([busy for _, busy, _ in shares], wall)
        metrics.MAKESPAN_RATIO.labels(self.stage).observe(ratio)
        metrics.BYTES_READ.labels(self.stage).inc(sum(read for _, _, read in shares))
        done: dict[int, R | Failure] = {}
        transient: Failure | None = None
        for share, (results, _, _) in zip(plan, shares, strict=True):
            for j, result in zip(share, results, strict=True):
                done[indexes[j]] = result
                if isinstance(result, Failure) and result.transient:
                    transient = result
        return done, transient


def stage_app(
    settings: Settings,
    broker: KafkaBroker,
    stage: BatchStage[Any, Any],
    in_topic: str,
    out_topic: str,
    out_schema: type[BaseModel],
) -> FastStream:
    """The faststream app of a batched stage: its subscriber (own consumer group
    `egoline-<stage>`, manual commits), its publisher (for the AsyncAPI document) and the worker
    pool's lifetime."""
    broker.publisher(out_topic, title=out_topic, schema=out_schema)

    @broker.subscriber(
        in_topic,
        title=stage.stage,
        **subscriber_options(settings, f"egoline-{stage.stage}", batch=True),
    )
    async def handle_batch(msg: KafkaMessage) -> None:
        await stage(msg)

    app = FastStream(broker)
    app.on_startup(stage.start)
    app.after_shutdown(stage.stop)
    return app
