"""Resumable multipart upload of one local file to its content-addressed raw key.

After a crash the upload resumes from the journal: parts the object store acknowledged are never
sent again (parts it holds that the journal missed, because the crash came between the store's
acknowledgement and the journal commit, are recognised by their MD5 and kept too). The upload
completes only if the file did not change while it was being sent; otherwise it is aborted and
nothing is left under the final key.

Integrity in transit: every part request is signed with SigV4 over the SHA-256 of its payload
(plain HTTP) or goes over TLS, so the store rejects altered bytes; the completed object's size
is checked. Parts are not MD5-hashed on the way out: on this 2-core machine that CPU is taken
from the object store. On resume, parts are MD5-compared with the store's ETags instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from services.agent.journal import Journal
from services.agent.ratelimit import TokenBucket
from services.agent.recordings import AgentInputError, LocalFile
from services.common.objectstore import ObjectStore
from services.common.retry import with_retries

log = logging.getLogger("egoline.agent")

SESSION = uuid.uuid4().hex  # one per agent process: tells resent parts from first sends
READ_AHEAD = 2  # parts read ahead per upload thread (memory: READ_AHEAD * concurrency * part)


class UploadVerificationError(RuntimeError):
    """The object store holds something other than what was sent."""


def part_ranges(size: int, part_size: int) -> list[tuple[int, int, int]]:
    """(part number from 1, byte offset, length) covering `size` bytes."""
    count = max(1, -(-size // part_size))
    return [(n + 1, n * part_size, min(part_size, size - n * part_size)) for n in range(count)]


@dataclass(frozen=True)
class Uploader:
    """What every upload of one agent shares: where to, the journal, and how."""

    store: ObjectStore
    journal: Journal
    part_size: int
    concurrency: int
    limiter: TokenBucket | None
    retry_max_s: float


def upload_file(
    up: Uploader, queue_id: str, key: str, local: LocalFile, on_bytes: Callable[[int], None]
) -> None:
    """Upload `local` to `key` (resuming if the journal has an open upload); raises on failure."""
    store, journal, part_size = up.store, up.journal, up.part_size
    limiter, retry_max_s = up.limiter, up.retry_max_s
    known = journal.upload(key)
    if known is not None and known[3]:
        on_bytes(local.size_bytes)
        return
    existing = with_retries(lambda: store.stat(key), retry_max_s)
    if existing is not None and existing.size == local.size_bytes:
        # Content-addressed: same key and size means the same bytes (a re-run after success).
        journal.complete_upload(key, queue_id, local.size_bytes)
        on_bytes(local.size_bytes)
        return
    if local.size_bytes <= part_size and len(local.paths) == 1:
        # One part's worth: a single PUT (atomic on S3), nothing to resume, no assembly step.
        if limiter is not None:
            limiter.acquire(local.size_bytes)
        with_retries(lambda: store.put_file(key, local.paths[0]), retry_max_s)
        if local.changed():
            with_retries(lambda: store.delete(key), retry_max_s)
            raise AgentInputError(f"{local.paths[0].name} changed while being uploaded")
        info = with_retries(lambda: store.stat(key), retry_max_s)
        if info is None or info.size != local.size_bytes:
            raise UploadVerificationError(f"{key}: size {info and info.size} != {local.size_bytes}")
        journal.complete_upload(key, queue_id, local.size_bytes)
        on_bytes(local.size_bytes)
        return
    upload_id: str | None = None
    acked: dict[int, str] = {}
    if known is not None and known[0] is not None and known[1] == part_size:
        upload_id = known[0]
        server = with_retries(lambda: store.list_parts(key, upload_id or ""), retry_max_s)
        if server is None:
            upload_id = None  # expired or aborted upstream: start over
        else:
            journaled = journal.acked_parts(key, upload_id)
            acked = {n: e for n, e in server.items() if journaled.get(n, e) == e}
    if upload_id is None:
        new_id = with_retries(lambda: store.create_multipart(key), retry_max_s)
        upload_id = new_id
        journal.open_upload(key, queue_id, new_id, part_size, local.size_bytes)
    assert upload_id is not None
    _send_parts(up, queue_id, key, upload_id, local, on_bytes, acked)


def _send_parts(
    up: Uploader,
    queue_id: str,
    key: str,
    upload_id: str,
    local: LocalFile,
    on_bytes: Callable[[int], None],
    acked: dict[int, str],
) -> None:
    store, journal, part_size, concurrency = up.store, up.journal, up.part_size, up.concurrency
    limiter, retry_max_s = up.limiter, up.retry_max_s
    etags: dict[int, str] = {}
    inflight: dict[Future[tuple[str, float]], tuple[int, int]] = {}

    def send(number: int, data: bytes) -> tuple[str, float]:
        sent_at = time.time()
        etag = with_retries(lambda: store.upload_part(key, upload_id, number, data), retry_max_s)
        return etag.strip('"'), sent_at

    def settle(done: set[Future[tuple[str, float]]]) -> None:
        for future in done:
            number, length = inflight.pop(future)
            etag, sent_at = future.result()
            journal.ack_part(key, upload_id, number, etag, length, (SESSION, sent_at))
            etags[number] = etag
            on_bytes(length)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="part") as pool:
        for number, offset, length in part_ranges(local.size_bytes, part_size):
            data = local.read_at(offset, length)
            if len(data) != length:
                raise AgentInputError(f"{local.paths[0].name} shrank while uploading")
            if number in acked:
                # Acknowledged before the restart: compare, don't send. S3's part ETag is the
                # MD5 of its bytes, so a mismatch means the file changed in between.
                digest = hashlib.md5(data).hexdigest()  # noqa: S324 - not for security
                if acked[number].strip('"') != digest:
                    raise AgentInputError(
                        f"{local.paths[0].name} changed since part {number} was uploaded"
                    )
                journal.ack_part(key, upload_id, number, digest, length, None)
                etags[number] = digest
                on_bytes(length)
                continue
            if limiter is not None:
                limiter.acquire(length)
            inflight[pool.submit(send, number, data)] = (number, length)
            if len(inflight) >= READ_AHEAD * concurrency:
                settle(wait(inflight, return_when=FIRST_COMPLETED).done)
        while inflight:
            settle(wait(inflight, return_when=FIRST_COMPLETED).done)
    if local.changed():
        with_retries(lambda: store.abort_multipart(key, upload_id), retry_max_s)
        raise AgentInputError(f"{local.paths[0].name} changed while being uploaded")
    with_retries(lambda: store.complete_multipart(key, upload_id, etags), retry_max_s)
    info = with_retries(lambda: store.stat(key), retry_max_s)
    if info is None or info.size != local.size_bytes:
        raise UploadVerificationError(f"{key}: size {info and info.size} != {local.size_bytes}")
    journal.complete_upload(key, queue_id, local.size_bytes)
