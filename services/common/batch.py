"""Batched stages on the consume protocol (`consume.py`), and their `run` step: jobs
bin-packed (LPT by cost) onto a pool of worker processes.

Work runs in a process pool (`spawn`: no fork after librdkafka threads start), ramped up from
one worker after each (re)start. Each worker process applies its memory limit, sweeps the
scratch of dead workers and builds its own object store client once (`init_worker`). A stage
is described by a `Stage`:
- `prepare(topic, value) -> Job | None` (pure, in the consumer process; raises PermanentError;
  None for a record that needs no work, which is simply committed),
- `cost(job) -> float` (for the bin-packing),
- `run(job) -> Result` (a top-level function, run in a worker process, under the time limit),
- `finish(jobs, results) -> Finished` (in the consumer process, in a thread: the place for
  batch-level effects such as packing clips of many episodes into shards).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from faststream import FastStream
from faststream.confluent import KafkaBroker
from pydantic import BaseModel

from schemas.events import TOPIC_CONSUMER_STATUS, ConsumerStatus, DlqRecord, ReasonCode, dlq_topic
from services.common import metrics
from services.common.consume import BatchConsumer, Finished, Publishers, subscribe
from services.common.failpoints import Failpoints
from services.common.limits import apply_memory_limit, time_limit
from services.common.objectstore import ObjectStore, object_store
from services.common.rawcache import RawCache, fetch_raw
from services.common.scheduling import Ramp, lpt_assign, makespan_ratio
from services.common.scratch import sweep_dead
from services.common.settings import Settings
from services.common.stage import Failure, Outcome, classify

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


@dataclass(frozen=True)
class Stage(Generic[J, R]):
    """A batched media stage, as data: what it reads, what it writes, and its steps."""

    name: str
    in_topic: str
    out_topic: str
    out_schema: type[BaseModel]
    prepare: Callable[[str, bytes], J | None]
    cost: Callable[[J], float]
    run: Callable[[J], R]
    finish: Callable[[dict[int, J], dict[int, R]], Finished]
    # Frees what `run` left on disk for `finish`, once the batch is done with it (finish may
    # run several times on one batch's results: retries and bisection).
    release: Callable[[dict[int, R]], None] | None = None


class PoolRunner(Generic[J, R]):
    """The `run` step of a media stage: a batch's jobs bin-packed onto worker processes."""

    def __init__(
        self, stage: str, run: Callable[[J], R], cost: Callable[[J], float], settings: Settings
    ) -> None:
        self.stage = stage
        self._run = run
        self._cost = cost
        self.settings = settings
        self.workers = settings.stage_workers
        self._pool: ProcessPoolExecutor | None = None
        self._ramp = Ramp(self.workers)

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

    async def run(self, jobs: dict[int, J]) -> dict[int, R | Failure]:
        if self._pool is None:
            raise RuntimeError(f"{self.stage}: worker pool not started")
        indexes = list(jobs)
        plan = lpt_assign([self._cost(jobs[i]) for i in indexes], self._ramp.next_width())
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            futures = [
                loop.run_in_executor(
                    self._pool,
                    run_jobs,
                    self._run,
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
            self.start()
            broke = Failure(Outcome.RETRY, ReasonCode.INTERNAL_ERROR, f"worker pool broke: {exc}")
            return dict.fromkeys(jobs, broke)
        wall = time.perf_counter() - started
        metrics.MAKESPAN_RATIO.labels(self.stage).observe(
            makespan_ratio([busy for _, busy, _ in shares], wall)
        )
        metrics.BYTES_READ.labels(self.stage).inc(sum(read for _, _, read in shares))
        done: dict[int, R | Failure] = {}
        for share, (results, _, _) in zip(plan, shares, strict=True):
            for j, result in zip(share, results, strict=True):
                done[indexes[j]] = result
        return done


def stage_consumer(
    settings: Settings,
    broker: KafkaBroker,
    stage: Stage[J, R],
    extra_schemas: Mapping[str, type[BaseModel] | None] | None = None,
) -> BatchConsumer[J, R]:
    """A media stage on the protocol: its publishers (output topic and DLQ) and pool runner."""
    publishers = Publishers(
        broker,
        {
            stage.out_topic: stage.out_schema,
            dlq_topic(stage.in_topic): DlqRecord,
            TOPIC_CONSUMER_STATUS: ConsumerStatus,
            **(extra_schemas or {}),
        },
    )
    return BatchConsumer(
        stage=stage.name,
        prepare=stage.prepare,
        runner=PoolRunner(stage.name, stage.run, stage.cost, settings),
        finish=stage.finish,
        publishers=publishers,
        step_attempts=settings.batch_step_attempts,
        step_backoff_s=settings.batch_step_backoff_s,
        release=stage.release,
        failpoints=Failpoints.parse(settings.failpoints),
    )


def stage_app(settings: Settings, broker: KafkaBroker, stage: Stage[Any, Any]) -> FastStream:
    return subscribe(settings, broker, stage_consumer(settings, broker, stage), (stage.in_topic,))
