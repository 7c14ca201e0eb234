"""One clip of a manifest row: its byte span in the shard (pure) and how to split it.

A clip's members (`.mp4`, `.imu.npy`, `.json`) are adjacent in its shard (docs/formats.md), so
the span from the first member's data to the last one's end, tar headers between them included,
is one ranged GET and one cache entry.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
from numpy.typing import NDArray

from services.common.objectstore import ObjectStore

# The manifest columns the reader needs (docs/formats.md); every other column rides along.
REQUIRED_COLUMNS = ("shard_key", "byte_offset", "length", "json_offset", "json_length")


@dataclass(frozen=True)
class ClipSpan:
    """Bytes [offset, offset + length) of shard `shard_key`, holding every member of one clip."""

    shard_key: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"bad span offset={self.offset} length={self.length}")


@dataclass(frozen=True)
class Clip:
    mp4: bytes
    imu: NDArray[np.floating[Any]] | None  # (M, 7) [t from clip start, accel, gyro]
    row: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)  # the clip's `.json` member
    frames: NDArray[np.uint8] | None = None  # (frames, height, width, 3) RGB, when decoded
    # Every video member by label (the main camera's name for `mp4`; `depth`, `wrist`...): the
    # members lie between the main one and the JSON, so the same ranged GET holds them.
    streams: dict[str, bytes] = field(default_factory=dict)


def _members(row: dict[str, Any]) -> list[tuple[int, int]]:
    members = [(int(row["byte_offset"]), int(row["length"]))]
    if row.get("imu_offset") is not None and row.get("imu_length"):
        members.append((int(row["imu_offset"]), int(row["imu_length"])))
    if row.get("json_offset") is not None and row.get("json_length"):
        members.append((int(row["json_offset"]), int(row["json_length"])))
    return members


def clip_span(row: dict[str, Any]) -> ClipSpan:
    """The span covering every member of the row's clip."""
    members = _members(row)
    start = min(offset for offset, _ in members)
    end = max(offset + length for offset, length in members)
    return ClipSpan(str(row["shard_key"]), start, end - start)


def split_clip(source: bytes | BinaryIO, row: dict[str, Any]) -> Clip:
    """Cut a clip's span (as `clip_span(row)` names it: its bytes, or a file holding exactly
    them) into its members. From a file each member is read straight into its own buffer, so
    the MP4 bytes are copied once, as a plain file read would."""
    span = clip_span(row)
    if isinstance(source, bytes | bytearray):
        size = len(source)
        view = memoryview(source)

        def read_at(begin: int, length: int) -> bytes:
            return bytes(view[begin : begin + length])
    else:
        size = os.fstat(source.fileno()).st_size

        def read_at(begin: int, length: int) -> bytes:
            source.seek(begin)
            return source.read(length)

    if size != span.length:
        raise ValueError(f"span of {row.get('clip_key')} is {size} bytes, not {span.length}")

    def member(offset_column: str, length_column: str) -> bytes | None:
        offset, length = row.get(offset_column), row.get(length_column)
        if offset is None or not length:
            return None
        data = read_at(int(offset) - span.offset, int(length))
        if len(data) != int(length):
            raise ValueError(f"short read of {row.get('clip_key')} {offset_column}")
        return data

    mp4 = member("byte_offset", "length")
    if mp4 is None:
        raise ValueError(f"row {row.get('clip_key')} has no mp4 member")
    raw_imu = member("imu_offset", "imu_length")
    raw_json = member("json_offset", "json_length")
    imu = None if raw_imu is None else np.load(io.BytesIO(raw_imu), allow_pickle=False)
    meta: dict[str, Any] = {} if raw_json is None else json.loads(raw_json)
    streams: dict[str, bytes] = {}
    base = int(row["byte_offset"]) - span.offset
    for entry in meta.get("streams", []):
        if entry.get("kind") != "video":
            continue
        begin, length = base + int(entry["offset_in_clip"]), int(entry["length"])
        if begin < 0 or begin + length > span.length:
            raise ValueError(f"member {entry.get('name')} lies outside the clip's span")
        streams[str(entry["label"])] = mp4 if begin == base else read_at(begin, length)
    return Clip(mp4=mp4, imu=imu, row=row, meta=meta, streams=streams)


def read_clip(store: ObjectStore, row: dict[str, Any]) -> Clip:
    """Fetch a clip (MP4, IMU slice, metadata) with one ranged GET of its shard, no cache."""
    span = clip_span(row)
    return split_clip(store.get_range(span.shard_key, span.offset, span.length), row)
