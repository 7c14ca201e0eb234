"""Resumable multipart upload of one local file to its content-addressed raw key.

After a crash the upload resumes from the journal: parts the object store acknowledged are never
sent again (parts it holds that the journal missed, because the crash came between the store's
acknowledgement and the journal commit, are recognised by their MD5 and kept too). If the journal
has no upload id for the key (lost, or the crash came before it was committed), the upload in
progress for the key is adopted from the store (ListMultipartUploads, then ListParts: part sizes
must fit this file's part ranges, ETags must equal the MD5 of the file's bytes) rather than a new
upload started and every part sent again. The upload
completes only if the file did not change while it was being sent; otherwise it is aborted and
nothing is left under the final key.

Integrity in transit: every part request is signed with SigV4 over the SHA-256 of its payload
(plain HTTP) or goes over TLS, so the store rejects altered bytes; the completed object is
checked against its parts (its multipart ETag, which their ETags determine, or its size by a
HEAD where the store's ETags are not MD5s). Parts are not MD5-hashed on the way out: on this
2-core machine that CPU is taken from the object store. On resume, parts are MD5-compared with
the store's ETags instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from services.agent.journal import AckedPart, Journal
from services.agent.ratelimit import TokenBucket
from services.agent.recordings import AgentInputError, LocalFile
from services.common.objectstore import ObjectStore, StoredPart
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


def multipart_etag(etags: dict[int, str]) -> str:
    """The ETag S3 (and MinIO, moto) gives an object completed from parts with these ETags:
    the MD5 of their binary MD5s in part order, then `-` and the part count. Equal to the
    store's answer, it proves the object is exactly these parts, so no HEAD is needed."""
    try:
        joined = b"".join(bytes.fromhex(etags[n]) for n in sorted(etags))
    except ValueError:
        return ""  # not hex MD5s: matches nothing
    return f"{hashlib.md5(joined).hexdigest()}-{len(etags)}"  # noqa: S324 - not for security


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
    if known is not None and known.complete:
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
    ranges = part_ranges(local.size_bytes, part_size)
    resumed = None
    if known is not None and known.upload_id is not None and known.part_size == part_size:
        resumed = _resume_known(up, key, known.upload_id, ranges)
    if resumed is None:
        # The journal lost the upload id (or never committed it: a crash right after
        # CreateMultipartUpload): the store's own list of uploads for the key is the record.
        resumed = _adopt_in_progress(up, key, ranges)
        if resumed is not None:
            journal.open_upload(key, queue_id, resumed[0], part_size, local.size_bytes)
            log.info("%s: adopted upload %s with %d parts", key, resumed[0], len(resumed[1]))
    if resumed is None:
        new_id = with_retries(lambda: store.create_multipart(key), retry_max_s)
        journal.open_upload(key, queue_id, new_id, part_size, local.size_bytes)
        resumed = (new_id, {})
    _send_parts(up, queue_id, key, resumed[0], local, on_bytes, resumed[1])


def _matching_parts(
    server: dict[int, StoredPart], ranges: list[tuple[int, int, int]]
) -> dict[int, str] | None:
    """{number: etag} of the stored parts if every one has the size this file's part of that
    number has (a size the store did not report passes; the MD5 check on reading catches it),
    else None: an upload cut with another part size cannot be continued."""
    lengths = {number: length for number, _, length in ranges}
    for number, part in server.items():
        if number not in lengths or part.size not in (-1, lengths[number]):
            return None
    return {number: part.etag for number, part in server.items()}


def _resume_known(
    up: Uploader, key: str, upload_id: str, ranges: list[tuple[int, int, int]]
) -> tuple[str, dict[int, str]] | None:
    """The journal's upload and the parts to keep, or None if the store no longer has it."""
    server = with_retries(lambda: up.store.list_parts(key, upload_id), up.retry_max_s)
    stored = None if server is None else _matching_parts(server, ranges)
    if stored is None:
        return None  # expired or aborted upstream, or cut differently: start over
    journaled = up.journal.acked_parts(key, upload_id)
    return upload_id, {n: e for n, e in stored.items() if journaled.get(n, e) == e}


def _adopt_in_progress(
    up: Uploader, key: str, ranges: list[tuple[int, int, int]]
) -> tuple[str, dict[int, str]] | None:
    """The newest upload in progress for `key` whose parts fit this file's part ranges, with
    the parts to keep (their ETags are MD5-checked against the file as it is read)."""
    for upload_id in reversed(with_retries(lambda: up.store.list_uploads(key), up.retry_max_s)):
        resumed = _resume_known(up, key, upload_id, ranges)
        if resumed is not None:
            return resumed
    return None


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
    inflight: dict[Future[tuple[str, float]], tuple[int, int, int]] = {}

    def send(number: int, data: bytes) -> tuple[str, float]:
        sent_at = time.time()
        etag = with_retries(lambda: store.upload_part(key, upload_id, number, data), retry_max_s)
        return etag.strip('"'), sent_at

    # Acknowledged parts are committed in batches of `concurrency` (one fsync each, not one per
    # part): a part the store holds that the journal missed is recognised on resume by ListParts
    # and its MD5, so a kill before the batch's commit costs no re-send.
    pending: list[AckedPart] = []

    def record(part: AckedPart) -> None:
        pending.append(part)
        etags[part.number] = part.etag
        on_bytes(part.length)
        if len(pending) >= concurrency:
            journal.ack_parts(key, upload_id, pending)
            pending.clear()

    def settle(done: set[Future[tuple[str, float]]]) -> None:
        for future in done:
            number, offset, length = inflight.pop(future)
            etag, sent_at = future.result()
            record(AckedPart(number, offset, length, etag, (SESSION, sent_at)))

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="part") as pool:
        for number, offset, length in part_ranges(local.size_bytes, part_size):
            data = local.read_at(offset, length)
            if len(data) != length:
                raise AgentInputError(f"{local.paths[0].name} shrank while uploading")
            if number in acked:
                # Acknowledged before the restart: compare, don't send. S3's part ETag is the
                # MD5 of its bytes. The key is the file's sha256, so a part that differs is not
                # this file's (a stale or damaged part): it is sent again, over the old one.
                digest = hashlib.md5(data).hexdigest()  # noqa: S324 - not for security
                if acked[number] == digest:
                    record(AckedPart(number, offset, length, digest, None))
                    continue
                log.warning("%s: stored part %d is not this file's; sending it again", key, number)
            if limiter is not None:
                limiter.acquire(length)
            inflight[pool.submit(send, number, data)] = (number, offset, length)
            if len(inflight) >= READ_AHEAD * concurrency:
                settle(wait(inflight, return_when=FIRST_COMPLETED).done)
        while inflight:
            settle(wait(inflight, return_when=FIRST_COMPLETED).done)
    journal.ack_parts(key, upload_id, pending)
    if local.changed():
        with_retries(lambda: store.abort_multipart(key, upload_id), retry_max_s)
        raise AgentInputError(f"{local.paths[0].name} changed while being uploaded")
    etag = with_retries(lambda: store.complete_multipart(key, upload_id, etags), retry_max_s)
    if etag != multipart_etag(etags):
        # A store whose ETags are not MD5s (SSE-KMS, some gateways): check the size instead.
        info = with_retries(lambda: store.stat(key), retry_max_s)
        if info is None or info.size != local.size_bytes:
            size = info and info.size
            raise UploadVerificationError(f"{key}: size {size} != {local.size_bytes}")
    journal.complete_upload(key, queue_id, local.size_bytes)
