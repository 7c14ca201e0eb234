"""The agent's work loop: queue ready episodes, upload them, publish their events, clean up.

The same loop serves `egoline agent upload PATH...` (one pass until the queue is drained) and
`egoline agent watch DIR` (forever, until SIGTERM/SIGINT).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from schemas.events import TOPIC_UPLOADED, EpisodeUploaded, derive_event_id
from services.agent.journal import Journal, QueueState
from services.agent.multipart import Uploader, upload_file
from services.agent.ratelimit import TokenBucket
from services.agent.recordings import AgentInputError, describe, find_ready
from services.common import kafka
from services.common.objectstore import ObjectStore
from services.common.retry import backoff_delay
from services.common.settings import DeviceSettings
from services.common.stage import is_transient

log = logging.getLogger("egoline.agent")


EpisodeDone = Callable[[str, QueueState, str | None], None]


@dataclass
class Progress:
    """Callbacks for a progress display; all optional."""

    on_episode_start: Callable[[str, int], None] = lambda _episode, _total: None
    on_bytes: Callable[[str, int], None] = lambda _episode, _n: None
    on_episode_done: EpisodeDone = lambda _episode, _state, _why: None


@dataclass
class Agent:
    settings: DeviceSettings
    store: ObjectStore
    journal: Journal
    producer: Producer
    progress: Progress = field(default_factory=Progress)
    _inflight: set[str] = field(default_factory=set)
    _outbox_lock: threading.Lock = field(default_factory=threading.Lock)

    limiter: TokenBucket | None = None
    uploader: Uploader = field(init=False)

    def __post_init__(self) -> None:
        part = self.settings.agent.part_size_mb * 1024 * 1024
        rate = self.settings.agent.bandwidth_mb_s
        if rate is not None:  # one bucket shared by every upload thread
            self.limiter = TokenBucket(rate * 1024 * 1024, burst=part)
        self.uploader = Uploader(
            store=self.store,
            journal=self.journal,
            part_size=part,
            concurrency=self.settings.agent.upload_concurrency,
            limiter=self.limiter,
            retry_max_s=self.settings.agent.retry_max_s,
        )

    # --- queueing ------------------------------------------------------------------------
    def enqueue(self, directories: list[Path]) -> int:
        """Queue episode folders the journal doesn't know yet; returns how many were new."""
        added = 0
        for directory in directories:
            directory = directory.resolve()
            if self.journal.knows_directory(directory):
                continue
            added += self.journal.add_episode(str(directory), directory)
        return added

    def scan(self, root: Path) -> int:
        ready = find_ready(
            root, self.settings.agent.ready_mode, self.settings.agent.stable_s, time.time()
        )
        return self.enqueue(ready)

    # --- uploading -----------------------------------------------------------------------
    def process_due(self, stop: threading.Event | None = None) -> None:
        """Upload every due episode, `agent_upload_concurrency` at a time (small files gain
        from parallel episodes, large ones from parallel parts); each event is handed to the
        producer as soon as its episode is complete."""
        rows = self.journal.due(time.time())
        with ThreadPoolExecutor(self.settings.agent.upload_concurrency) as pool:
            futures = []
            for row in rows:
                if stop is not None and stop.is_set():
                    break
                futures.append(pool.submit(self._process, row.queue_id, Path(row.directory)))
            for future in futures:
                future.result()
                self.publish(timeout_s=0)

    def _process(self, queue_id: str, directory: Path) -> None:
        try:
            episode = describe(directory)
            total = sum(f.size_bytes for _, f in episode.files())
            self.journal.start_upload(queue_id, total)
            self.progress.on_episode_start(queue_id, total)
            for source, local in episode.files():
                upload_file(
                    self.uploader,
                    queue_id,
                    source.key,
                    local,
                    lambda n: self.progress.on_bytes(queue_id, n),
                )
        except AgentInputError as exc:
            log.error("%s: %s", directory, exc)
            self.journal.set_state(queue_id, QueueState.FAILED, str(exc))
            self.progress.on_episode_done(queue_id, QueueState.FAILED, str(exc))
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            row = self.journal.episode(queue_id)
            delay = backoff_delay((row.attempts if row else 0) + 1, base_s=2.0, cap_s=300.0)
            self.journal.schedule_retry(queue_id, f"transient: {exc}"[:500], delay)
            self.progress.on_episode_done(queue_id, QueueState.RETRY, str(exc))
            return
        event = EpisodeUploaded(
            event_id=derive_event_id("uploaded", episode.ref.episode_id, episode.ref.video.sha256),
            produced_at=datetime.now(UTC),
            pipeline_version=self.settings.pipeline_version,
            episode=episode.ref,
        )
        self.journal.store_event(queue_id, event.model_dump_json())
        self.progress.on_episode_done(queue_id, QueueState.UPLOADED, None)

    # --- publishing (the outbox) ---------------------------------------------------------
    def publish(self, timeout_s: float) -> None:
        """Send every stored event not yet acknowledged; wait up to `timeout_s` for acks.

        An event stays in the outbox until Kafka acknowledges it; one already handed to the
        producer is not handed over again (the idempotent producer retries it itself).
        """
        with self._outbox_lock:
            self._produce_pending()
        deadline = time.monotonic() + timeout_s
        self.producer.poll(0)
        while self._inflight and time.monotonic() < deadline:
            self.producer.poll(min(0.5, max(0.0, deadline - time.monotonic())))

    def _produce_pending(self) -> None:
        for row in self.journal.episodes((QueueState.UPLOADED,)):
            if row.queue_id in self._inflight or row.event_json is None:
                continue
            event = EpisodeUploaded.model_validate_json(row.event_json)
            self._inflight.add(row.queue_id)
            self.producer.produce(
                TOPIC_UPLOADED,
                key=event.episode.episode_id.encode(),
                value=row.event_json.encode(),
                headers={"event_id": event.event_id, "content-type": "application/json"},
                on_delivery=partial(self._on_delivery, row.queue_id),
            )

    def _on_delivery(self, queue_id: str, err: Any, _msg: Any) -> None:
        self._inflight.discard(queue_id)
        if err is not None:
            log.warning("event for %s not delivered (will retry): %s", queue_id, err)
            return
        self.journal.set_state(queue_id, QueueState.PUBLISHED)
        self.progress.on_episode_done(queue_id, QueueState.PUBLISHED, None)
        self._after_publish(queue_id)

    def _after_publish(self, queue_id: str) -> None:
        """Remove or archive the local copy, only now that the event is acknowledged."""
        mode = self.settings.agent.after_publish
        row = self.journal.episode(queue_id)
        if mode == "keep" or row is None:
            return
        directory = Path(row.directory)
        if mode == "delete":
            shutil.rmtree(directory, ignore_errors=True)
            self.journal.set_state(queue_id, QueueState.DELETED)
        else:
            archive = self.settings.agent.archive_dir or directory.parent / ".archive"
            archive.mkdir(parents=True, exist_ok=True)
            shutil.move(str(directory), str(archive / directory.name))
            self.journal.set_state(queue_id, QueueState.ARCHIVED)

    # --- loops ---------------------------------------------------------------------------
    def run_once(self, directories: list[Path], publish_timeout_s: float) -> dict[str, int]:
        """Queue, upload and publish; returns the journal's counts per state."""
        self.enqueue(directories)
        self.process_due()
        self.publish(publish_timeout_s)
        return self.journal.counts()

    def watch(self, root: Path, stop: threading.Event) -> None:
        while not stop.is_set():
            self.scan(root)
            self.process_due(stop)
            self.publish(timeout_s=1.0)
            stop.wait(self.settings.agent.poll_s)
        self.publish(timeout_s=10.0)
        self.producer.flush(10)


def make_agent(
    settings: DeviceSettings,
    store: ObjectStore,
    progress: Progress | None = None,
    producer: Producer | None = None,
) -> Agent:
    """An agent on its own journal; `producer` is shared if given (one per process: each new
    one opens its own broker connections and idempotent-producer id)."""
    journal = Journal(settings.agent.state_dir / "journal.sqlite")
    return Agent(
        settings, store, journal, producer or make_producer(settings), progress or Progress()
    )


def make_producer(settings: DeviceSettings) -> Producer:
    return Producer(
        {
            **kafka.producer_config(settings),
            # keep trying to deliver through broker outages; the journal holds the event anyway
            "message.timeout.ms": int(settings.agent.message_timeout_s * 1000),
        }
    )
