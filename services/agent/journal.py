"""The agent's local journal (SQLite): every episode's state and every acknowledged part.

It is the agent's memory across crashes, kill -9 and power loss: SQLite in WAL mode with
synchronous=FULL makes each commit durable before the agent moves on, so a part recorded here
was acknowledged by the object store, and an event recorded here as published was acknowledged
by Kafka.

Episodes are keyed by their folder (`queue_id`, the resolved path): the episode id itself comes
from `episode.json`, which is only trusted once read and validated.

Episode states: pending -> uploading -> uploaded (event waiting in the outbox) -> published
-> (archived | deleted); `retry` (transient failure, with a next attempt time) and `failed`
(bad input, with a reason; nothing is published).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS episodes (
    queue_id TEXT PRIMARY KEY,
    directory TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    event_json TEXT,
    bytes_total INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS uploads (
    object_key TEXT PRIMARY KEY,
    queue_id TEXT NOT NULL,
    upload_id TEXT,
    part_size INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    complete INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS parts (
    object_key TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    part_number INTEGER NOT NULL,
    etag TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    acked_at REAL NOT NULL,
    PRIMARY KEY (object_key, upload_id, part_number)
);
CREATE TABLE IF NOT EXISTS sends (
    object_key TEXT NOT NULL,
    upload_id TEXT NOT NULL,
    part_number INTEGER NOT NULL,
    byte_offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    session TEXT NOT NULL,
    sent_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sends_by_key ON sends (object_key, byte_offset);
"""


class QueueState(StrEnum):
    """Where an episode folder is in the agent's queue (the journal's `episodes.state`)."""

    PENDING = "pending"
    UPLOADING = "uploading"
    UPLOADED = "uploaded"  # every file in the store, the event not yet acknowledged
    PUBLISHED = "published"
    ARCHIVED = "archived"
    DELETED = "deleted"
    RETRY = "retry"  # a transient failure: due again at `next_attempt_at`
    FAILED = "failed"  # bad input: kept with its reason, never retried


STATES = tuple(QueueState)


EPISODE_COLUMNS = (
    "queue_id, directory, state, reason, event_json, bytes_total, attempts, next_attempt_at"
)


@dataclass(frozen=True)
class AckedPart:
    """A part the store acknowledged: its number (from 1), where it lies in the file (bytes),
    its ETag, and the send that carried it (session, unix time), or None for a part recognised
    on resume that this process did not send."""

    number: int
    byte_offset: int
    length: int
    etag: str
    sent: tuple[str, float] | None


@dataclass(frozen=True)
class EpisodeRow:
    """A queued episode folder: its state, the last failure's reason, the event once built."""

    queue_id: str
    directory: str
    state: QueueState
    reason: str | None
    event_json: str | None
    bytes_total: int
    attempts: int
    next_attempt_at: float  # unix time


@dataclass(frozen=True)
class UploadRow:
    """The journal's record of one object: its multipart upload id (None: a single PUT, or
    the id was never committed), part size and file size in bytes, and whether it is done."""

    upload_id: str | None
    part_size: int
    size_bytes: int
    complete: bool


class Journal:
    """Thread-safe access to the journal file (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, params: tuple[object, ...]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(sql, params)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())

    # --- episodes ------------------------------------------------------------------------
    def add_episode(self, queue_id: str, directory: Path) -> bool:
        """Queue an episode once; returns False if the journal already knows it."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO episodes (queue_id, directory, state, updated_at) "
                "VALUES (?, ?, 'pending', ?)",
                (queue_id, str(directory), time.time()),
            )
            return cur.rowcount == 1

    def knows_directory(self, directory: Path) -> bool:
        return bool(self._read("SELECT 1 FROM episodes WHERE directory = ?", (str(directory),)))

    def set_state(self, queue_id: str, state: QueueState, reason: str | None = None) -> None:
        self._write(
            "UPDATE episodes SET state = ?, reason = ?, updated_at = ? WHERE queue_id = ?",
            (QueueState(state).value, reason, time.time(), queue_id),
        )

    def start_upload(self, queue_id: str, bytes_total: int) -> None:
        """State `uploading` with the episode's size in bytes, in one commit."""
        self._write(
            "UPDATE episodes SET state = 'uploading', reason = NULL, bytes_total = ?, "
            "updated_at = ? WHERE queue_id = ?",
            (bytes_total, time.time(), queue_id),
        )

    def schedule_retry(self, queue_id: str, reason: str, delay_s: float) -> None:
        self._write(
            "UPDATE episodes SET state = 'retry', reason = ?, attempts = attempts + 1, "
            "next_attempt_at = ?, updated_at = ? WHERE queue_id = ?",
            (reason, time.time() + delay_s, time.time(), queue_id),
        )

    def store_event(self, queue_id: str, event_json: str) -> None:
        """Put the episode's event in the outbox (state `uploaded`), once: a stored event is
        never rebuilt, so every publish attempt sends the same bytes and event id."""
        self._write(
            "UPDATE episodes SET event_json = COALESCE(event_json, ?), state = 'uploaded', "
            "reason = NULL, updated_at = ? WHERE queue_id = ?",
            (event_json, time.time(), queue_id),
        )

    def episode(self, queue_id: str) -> EpisodeRow | None:
        rows = self._read(f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE queue_id = ?", (queue_id,))  # noqa: S608
        return EpisodeRow(*rows[0]) if rows else None  # type: ignore[arg-type]

    def episodes(self, states: tuple[QueueState, ...] = STATES) -> list[EpisodeRow]:
        marks = ",".join("?" for _ in states)
        rows = self._read(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE state IN ({marks}) ORDER BY queue_id",  # noqa: S608
            tuple(state.value for state in states),
        )
        return [
            EpisodeRow(
                queue_id=str(queue_id),
                directory=str(directory),
                state=QueueState(str(state)),
                reason=None if reason is None else str(reason),
                event_json=None if event_json is None else str(event_json),
                bytes_total=int(str(bytes_total)),
                attempts=int(str(attempts)),
                next_attempt_at=float(str(next_attempt_at)),
            )
            for queue_id, directory, state, reason, event_json, bytes_total, attempts, next_attempt_at in rows  # noqa: E501
        ]

    def due(self, now: float) -> list[EpisodeRow]:
        """Episodes to upload now: pending, interrupted mid-upload, or retries whose time came."""
        return [
            e
            for e in self.episodes((QueueState.PENDING, QueueState.UPLOADING, QueueState.RETRY))
            if e.state is not QueueState.RETRY or e.next_attempt_at <= now
        ]

    def counts(self) -> dict[str, int]:
        rows = self._read("SELECT state, count(*) FROM episodes GROUP BY state")
        return {str(state): int(str(n)) for state, n in rows}

    # --- multipart uploads ---------------------------------------------------------------
    def upload(self, object_key: str) -> UploadRow | None:
        """The journal's record of an object, if it has one."""
        rows = self._read(
            "SELECT upload_id, part_size, size_bytes, complete FROM uploads WHERE object_key = ?",
            (object_key,),
        )
        if not rows:
            return None
        upload_id, part_size, size, complete = rows[0]
        return UploadRow(
            upload_id=None if upload_id is None else str(upload_id),
            part_size=int(str(part_size)),
            size_bytes=int(str(size)),
            complete=bool(complete),
        )

    def open_upload(
        self, object_key: str, queue_id: str, upload_id: str, part_size: int, size: int
    ) -> None:
        self._write(
            "INSERT INTO uploads (object_key, queue_id, upload_id, part_size, size_bytes) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (object_key) DO UPDATE SET "
            "upload_id = excluded.upload_id, part_size = excluded.part_size, "
            "size_bytes = excluded.size_bytes, complete = 0",
            (object_key, queue_id, upload_id, part_size, size),
        )

    def complete_upload(self, object_key: str, queue_id: str, size: int) -> None:
        self._write(
            "INSERT INTO uploads (object_key, queue_id, part_size, size_bytes, complete) "
            "VALUES (?, ?, 0, ?, 1) ON CONFLICT (object_key) DO UPDATE SET complete = 1",
            (object_key, queue_id, size),
        )

    def acked_parts(self, object_key: str, upload_id: str) -> dict[int, str]:
        rows = self._read(
            "SELECT part_number, etag FROM parts WHERE object_key = ? AND upload_id = ?",
            (object_key, upload_id),
        )
        return {int(str(n)): str(etag) for n, etag in rows}

    def ack_parts(self, object_key: str, upload_id: str, parts: list[AckedPart]) -> None:
        """Record parts the store acknowledged, each with the send that carried it, in one
        durable transaction (a batch costs one fsync, not one per part)."""
        if not parts:
            return
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO sends VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (object_key, upload_id, p.number, p.byte_offset, p.length, *p.sent)
                        for p in parts
                        if p.sent is not None
                    ],
                )
                self._db.executemany(
                    "INSERT OR IGNORE INTO parts VALUES (?, ?, ?, ?, ?, ?)",
                    [(object_key, upload_id, p.number, p.etag, p.length, now) for p in parts],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def parts_resent(self) -> int:
        """Acknowledged sends of a byte range of a file (its raw key) that an earlier
        acknowledged send of the same file already covered, in whole or in part, whatever the
        multipart upload id of either. The resume logic aims for 0.

        Only acknowledged sends are logged: a part in flight when the agent dies is lost with
        the process and is not counted when it goes again."""
        rows = self._read(
            "SELECT count(*) FROM sends s WHERE EXISTS (SELECT 1 FROM sends e "
            "WHERE e.object_key = s.object_key AND e.rowid < s.rowid "
            "AND e.byte_offset < s.byte_offset + s.length "
            "AND s.byte_offset < e.byte_offset + e.length)"
        )
        return int(str(rows[0][0]))


def count_acked_parts(path: Path) -> int:
    """Acknowledged parts in a journal file, read-only, as another process sees it while the
    agent writes (0 while the file or its tables don't exist yet). For monitoring and tests."""
    if not path.exists():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT count(*) FROM parts").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
