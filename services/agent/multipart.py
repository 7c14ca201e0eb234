"""Resumable multipart upload of one local file to its content-addressed raw key.

After a crash the upload resumes from the journal: parts the object store acknowledged are never
sent again (parts it holds that the journal missed, because the crash came between the store's
acknowledgement and the journal commit, are recognised by their MD5 and kept too). Each part's
ETag is checked against the MD5 of the bytes sent; the completed object is checked for size and
for the multipart ETag computed locally. The upload completes only if the file did not change
while it was being sent; otherwise it is aborted and nothing is left under the final key.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from services.agent.journal import Journal
from services.agent.ratelimit import TokenBucket
from services.agent.recordings import AgentInputError, LocalFile
from services.agent.retry import with_retries
from services.common.objectstore import ObjectStore

log = logging.getLogger("egoline.agent")

SESSION = uuid.uuid4().hex  # one per agent process: tells resent parts from first sends


class UploadVerificationError(RuntimeError):
    """The object store holds something other than what was sent."""


def part_ranges(size: int, part_size: int) -> list[tuple[int, int, int]]:
    """(part number from 1, byte offset, length) covering `size` bytes."""
    count = max(1, -(-size // part_size))
    return [(n + 1, n * part_size, min(part_size, size - n * part_size)) for n in range(count)]


def multipart_etag(part_md5s: list[bytes]) -> str:
    """The ETag S3 (and MinIO) give a multipart object: md5 of the part digests, dash, count."""
    return f"{hashlib.md5(b''.join(part_md5s)).hexdigest()}-{len(part_md5s)}"  # noqa: S324


def upload_file(
    store: ObjectStore,
    journal: Journal,
    queue_id: str,
    key: str,
    local: LocalFile,
    part_size: int,
    concurrency: int,
    limiter: TokenBucket | None,
    on_bytes: Callable[[int], None],
    retry_max_s: float,
) -> None:
    """Upload `local` to `key` (resuming if the journal has an open upload); raises on failure."""
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
    _send_parts(
        store,
        journal,
        queue_id,
        key,
        upload_id,
        local,
        part_size,
        concurrency,
        limiter,
        on_bytes,
        retry_max_s,
        acked,
    )


def _send_parts(
    store: ObjectStore,
    journal: Journal,
    queue_id: str,
    key: str,
    upload_id: str,
    local: LocalFile,
    part_size: int,
    concurrency: int,
    limiter: TokenBucket | None,
    on_bytes: Callable[[int], None],
    retry_max_s: float,
    acked: dict[int, str],
) -> None:
    etags: dict[int, str] = {}
    md5s: dict[int, bytes] = {}
    inflight: dict[Future[str], tuple[int, str, int]] = {}

    def settle(done: set[Future[str]]) -> None:
        for future in done:
            number, md5_hex, length = inflight.pop(future)
            etag = future.result()
            if etag.strip('"') != md5_hex:
                raise UploadVerificationError(
                    f"part {number} of {key}: ETag {etag} != MD5 {md5_hex}"
                )
            journal.ack_part(key, upload_id, number, md5_hex, length)
            etags[number] = md5_hex
            on_bytes(length)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="part") as pool:
        for number, offset, length in part_ranges(local.size_bytes, part_size):
            data = local.read_at(offset, length)
            if len(data) != length:
                raise AgentInputError(f"{local.paths[0].name} shrank while uploading")
            digest = hashlib.md5(data)  # noqa: S324 - S3's part checksum, not security
            md5s[number] = digest.digest()
            if number in acked:
                if acked[number].strip('"') != digest.hexdigest():
                    raise AgentInputError(
                        f"{local.paths[0].name} changed since part {number} was uploaded"
                    )
                journal.ack_part(key, upload_id, number, digest.hexdigest(), length)
                etags[number] = digest.hexdigest()
                on_bytes(length)
                continue
            if limiter is not None:
                limiter.acquire(length)
            journal.record_send(key, number, SESSION, already_acked=False)
            future = pool.submit(
                with_retries,
                lambda n=number, d=data: store.upload_part(key, upload_id, n, d),
                retry_max_s,
            )
            inflight[future] = (number, digest.hexdigest(), length)
            if len(inflight) >= 2 * concurrency:
                settle(wait(inflight, return_when=FIRST_COMPLETED).done)
        while inflight:
            settle(wait(inflight, return_when=FIRST_COMPLETED).done)
    if local.changed():
        with_retries(lambda: store.abort_multipart(key, upload_id), retry_max_s)
        raise AgentInputError(f"{local.paths[0].name} changed while being uploaded")
    object_etag = with_retries(lambda: store.complete_multipart(key, upload_id, etags), retry_max_s)
    expected = multipart_etag([md5s[n] for n in sorted(md5s)])
    info = with_retries(lambda: store.stat(key), retry_max_s)
    if info is None or info.size != local.size_bytes:
        raise UploadVerificationError(f"{key}: size {info and info.size} != {local.size_bytes}")
    if "-" in object_etag and object_etag.strip('"') != expected:
        raise UploadVerificationError(f"{key}: ETag {object_etag} != expected {expected}")
    journal.complete_upload(key, queue_id, local.size_bytes)
