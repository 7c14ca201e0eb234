"""The object store behind a small interface, spoken only through the S3 API (MinIO, AWS, moto)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import urllib3
from minio import Minio
from minio.datatypes import Part
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from services.common.retry import backoff_delay
from services.common.settings import DeviceSettings

READ_ATTEMPTS = 5  # a GET whose body is cut off is sent again this many times in all


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class StoredPart:
    """One part of a multipart upload in progress: its ETag (hex MD5 of the part's bytes on
    S3, MinIO and moto) and its size in bytes (-1 if the store did not report it)."""

    etag: str
    size: int


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    last_modified: datetime


class ObjectStore:
    """Put, get and byte-range reads against one bucket.

    Keys are plain S3 keys; callers build them from validated ids only.
    """

    def __init__(self, client: Minio, bucket: str, part_size: int) -> None:
        self.client = client
        self.bucket = bucket
        self.part_size = part_size
        self.bytes_read = 0  # object bytes fetched by this client (for bytes-read-per-byte)

    def ensure_bucket(self) -> None:
        if not self.client.bucket_exists(self.bucket):
            try:
                self.client.make_bucket(self.bucket)
            except S3Error as exc:  # another process won the race
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

    def put_file(
        self,
        key: str,
        path: Path,
        content_type: str = "application/octet-stream",
        single_put_max: int = 0,
    ) -> None:
        """Upload a file; files over `part_size` go as multipart uploads of `part_size`
        bytes, unless they fit in `single_put_max` (S3 allows single PUTs up to 5 GiB, and a
        single PUT skips the store's part-assembly step)."""
        size = path.stat().st_size
        single = 0 < size <= min(single_put_max, 5 << 30)
        self.client.fput_object(
            self.bucket,
            key,
            str(path),
            content_type=content_type,
            part_size=max(size, 5 << 20) if single else self.part_size,
        )

    def put_bytes(
        self, key: str, data: bytes, content_type: str = "application/octet-stream"
    ) -> None:
        self.client.put_object(
            self.bucket, key, io.BytesIO(data), len(data), content_type=content_type
        )

    def get_bytes(self, key: str) -> bytes:
        return self._read(key, 0, None)

    def get_range(self, key: str, byte_offset: int, length: int) -> bytes:
        """Read `length` bytes starting at `byte_offset` with one ranged GET."""
        if byte_offset < 0 or length <= 0:
            raise ValueError(f"bad range offset={byte_offset} length={length}")
        return self._read(key, byte_offset, length)

    def _read(self, key: str, byte_offset: int, length: int | None) -> bytes:
        """One GET, read whole. urllib3 retries a request that failed to connect or got a 5xx,
        but not a body cut off mid-transfer (a reset after the headers): that is retried here,
        with backoff, and a short ranged body counts as cut off."""
        for attempt in range(READ_ATTEMPTS):
            response = self.client.get_object(
                self.bucket, key, offset=byte_offset, length=length or 0
            )
            try:
                data = response.read()
                if length is not None and len(data) != length:
                    raise urllib3.exceptions.ProtocolError(f"{key}: {len(data)} of {length} bytes")
                self.bytes_read += len(data)
                return data
            except urllib3.exceptions.HTTPError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                time.sleep(backoff_delay(attempt, base_s=0.1, cap_s=2.0))
            finally:
                response.close()
                response.release_conn()
        raise AssertionError("unreachable")

    # --- resumable multipart uploads -------------------------------------------------------
    # minio-py's public API uploads a file in one call; resuming after a crash needs the
    # individual S3 calls (CreateMultipartUpload, UploadPart, ListParts, Complete/Abort), which
    # minio-py implements as underscore methods. They are wrapped here, in one place.

    def create_multipart(self, key: str, content_type: str = "application/octet-stream") -> str:
        """Start a multipart upload; returns its upload id."""
        return str(
            self.client._create_multipart_upload(self.bucket, key, {"Content-Type": content_type})
        )

    def upload_part(self, key: str, upload_id: str, part_number: int, data: bytes) -> str:
        """Upload one part (1-based number); returns its ETag (hex MD5 of the part)."""
        return str(self.client._upload_part(self.bucket, key, data, None, upload_id, part_number))

    def list_parts(self, key: str, upload_id: str) -> dict[int, StoredPart] | None:
        """Parts the store holds for an upload, by number, or None if the upload is gone."""
        parts: dict[int, StoredPart] = {}
        marker: str | None = None
        while True:
            try:
                result = self.client._list_parts(
                    self.bucket, key, upload_id, part_number_marker=marker
                )
            except S3Error as exc:
                if exc.code == "NoSuchUpload":
                    return None
                raise
            for p in result.parts:
                size = -1 if p.size is None else int(p.size)  # -1: the store did not say
                parts[p.part_number] = StoredPart(p.etag.strip('"'), size)
            if not result.is_truncated:
                return parts
            marker = result.next_part_number_marker

    def list_uploads(self, key: str) -> list[str]:
        """Ids of the multipart uploads in progress for exactly `key`, oldest first (S3 lists
        the uploads of one key in initiation order)."""
        ids: list[str] = []
        key_marker: str | None = None
        id_marker: str | None = None
        while True:
            result = self.client._list_multipart_uploads(
                self.bucket, prefix=key, key_marker=key_marker, upload_id_marker=id_marker
            )
            ids += [str(u.upload_id) for u in result.uploads if u.object_name == key]
            if not result.is_truncated or not result.uploads:
                return ids
            # minio-py misnames the parsed NextUploadIdMarker; the last listed id is the same
            key_marker = result.uploads[-1].object_name
            id_marker = result.uploads[-1].upload_id

    def complete_multipart(self, key: str, upload_id: str, etags: dict[int, str]) -> str:
        """Complete an upload from its parts in number order; returns the object's ETag."""
        parts = [Part(number, etag) for number, etag in sorted(etags.items())]
        result = self.client._complete_multipart_upload(self.bucket, key, upload_id, parts)
        return str(result.etag).strip('"')

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self.client._abort_multipart_upload(self.bucket, key, upload_id)
        except S3Error as exc:
            if exc.code != "NoSuchUpload":
                raise

    def download(self, key: str, path: Path) -> None:
        self.client.fget_object(self.bucket, key, str(path))
        self.bytes_read += path.stat().st_size

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            info = self.client.stat_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "ResourceNotFound"):
                return None
            raise
        return ObjectInfo(key=key, size=int(info.size or 0), etag=str(info.etag))

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def delete(self, key: str) -> None:
        self.client.remove_object(self.bucket, key)

    def list_keys(self, prefix: str) -> list[str]:
        return [o.key for o in self.list_objects(prefix)]

    def list_objects(self, prefix: str) -> list[ListedObject]:
        return [
            ListedObject(
                key=str(o.object_name),
                size=int(o.size or 0),
                last_modified=o.last_modified or datetime.fromtimestamp(0, UTC),
            )
            for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=True)
        ]

    def delete_many(self, keys: Iterable[str]) -> int:
        """One DeleteObjects request per 1000 keys; raises on the first key the store refused."""
        targets = [DeleteObject(k) for k in keys]
        for i in range(0, len(targets), 1000):
            for error in self.client.remove_objects(self.bucket, targets[i : i + 1000]):
                raise RuntimeError(f"delete {error.name}: {error.code} {error.message}")
        return len(targets)


def minio_client(settings: DeviceSettings) -> Minio:
    endpoint = settings.require("s3.endpoint")
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    tls: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED" if settings.s3.tls_verify else "CERT_NONE"}
    if settings.s3.ca_bundle:
        tls["ca_certs"] = settings.s3.ca_bundle
    http = urllib3.PoolManager(
        maxsize=16,
        timeout=urllib3.Timeout(connect=5, read=120),
        retries=urllib3.Retry(total=5, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
        **tls,
    )
    return Minio(
        parsed.netloc,
        access_key=settings.s3.access_key.get_secret_value(),
        secret_key=settings.s3.secret_key.get_secret_value(),
        secure=parsed.scheme == "https",
        region=settings.s3.region,
        http_client=http,
    )


def object_store(settings: DeviceSettings) -> ObjectStore:
    return ObjectStore(
        minio_client(settings), settings.s3.bucket, settings.s3.part_size_mb * 1024 * 1024
    )
