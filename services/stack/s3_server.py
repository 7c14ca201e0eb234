"""The embedded object store: moto's S3 server, with ranged GETs served in O(range).

moto 5.2 answers a ranged GET by reading the whole object out of its buffer (`FakeKey.value`),
running a regex over all of it (`_enrich_response` rewrites `<RequestId>` in XML bodies), and
only then slicing the range. A 2 MiB clip from a 512 MiB shard therefore cost ~0.5 s when the
machine was quiet and 1.3-1.9 s under load (measured: fresh memory costs 0.4-3 s/GiB to touch
on this VM), where S3 and MinIO serve a range in time proportional to the range. The reader
reads every clip as one ranged GET of a shard (docs/reader.md), so the emulator, not the design,
would set the cold-read figures.

Here, for a GET with one plain `bytes=a-b` range and no part number, the key's value is a
`_Window`: its length is the object's, and slicing it (what moto's range handling does) reads
only that slice from the key's buffer, under the key's own lock. Every other request is moto's
own code path, untouched.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from moto.s3.models import FakeKey
from moto.s3.responses import S3Response
from moto.server import main

_SIMPLE_RANGE = re.compile(r"bytes=(\d+)-(\d+)")
_request = threading.local()


class _Window:
    """Stands in for a key's bytes during a ranged GET: `len` and slicing, nothing else (a
    regex over it raises TypeError, which moto's `_enrich_response` already ignores)."""

    def __init__(self, key: FakeKey) -> None:
        self._key = key

    def __len__(self) -> int:
        return int(self._key.size)

    def __getitem__(self, item: slice) -> bytes:
        if not isinstance(item, slice):
            raise TypeError("a ranged GET's value is only sliced")
        start, stop, step = item.indices(len(self))
        if step != 1:
            raise ValueError("step slices are not supported")
        with self._key.lock:
            buffer = self._key._value_buffer
            buffer.seek(start)
            return bytes(buffer.read(max(0, stop - start)))


_plain_value: property = vars(FakeKey)["value"]
if _plain_value.fget is None:
    raise RuntimeError("moto's FakeKey.value is no longer a readable property")
_plain_get = _plain_value.fget
_plain_key_response = S3Response.key_response


def _value(self: FakeKey) -> Any:
    if getattr(_request, "ranged_get", False):
        return _Window(self)
    return _plain_get(self)


def _key_response(self: S3Response, request: Any, full_url: str, headers: Any) -> Any:
    match = (
        _SIMPLE_RANGE.fullmatch(request.headers.get("range", "").strip())
        if request.method == "GET" and "partNumber" not in full_url
        else None
    )
    _request.ranged_get = match is not None and int(match[1]) <= int(match[2])
    try:
        return _plain_key_response(self, request, full_url, headers)
    finally:
        _request.ranged_get = False


def install() -> None:
    """Patch moto in this process (idempotent)."""
    FakeKey.value = property(_value, _plain_value.fset)  # type: ignore[assignment]
    S3Response.key_response = _key_response  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    main()
