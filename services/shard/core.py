"""Pure shard logic: GOP-aligned clip boundaries, first-fit-decreasing packing, tar layout, and
what a shard says about itself: each clip's `.json` member and the shard's index.

Shard format (WebDataset-compatible POSIX tar, documented in docs/formats.md): per clip three
members `<clip_key>.mp4`, `<clip_key>.imu.npy` (when the episode has IMU) and `<clip_key>.json`,
grouped by key in clip order; every header is deterministic (mtime 0, uid/gid 0, mode 0644) so
the same clips give byte-identical shards and so the same content-addressed key.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO, cast

import numpy as np
from numpy.typing import NDArray

from schemas.events import ClipMember, ClipQuality, ClipRecord, EpisodeValidated, StreamInfo
from services.media import cutting

# 2: one member per video stream (`<key>.<label>.mp4|mkv` beside `<key>.mp4`), the IMU slice
# as (M, 7) float64 [t from clip start, ax, ay, az, gx, gy, gz], a `streams` list in the JSON.
# 3: the clip's content signals as `quality` in the JSON (docs/curation.md).
SHARD_FORMAT_VERSION = 3
TAR_BLOCK = 512


def plan_clips(
    keyframe_times_s: Sequence[float], duration_s: float, target_s: float
) -> list[tuple[float, float]]:
    """Cut [first keyframe, duration) at keyframes into clips of about `target_s` seconds
    (`services.media.cutting.plan_clips` over one stream's keyframes)."""
    if target_s <= 0:
        raise ValueError("target_s must be positive")
    keys = sorted(k for k in keyframe_times_s if 0 <= k < duration_s)
    if not keys:
        return []
    return cutting.plan_clips(keys, keys[0], duration_s, target_s)


def member_offsets(sizes: Sequence[int]) -> list[int]:
    """Where each member's data starts, relative to the first member's data, when members of
    these sizes are written in order into a ustar tar (one 512-byte header each, data padded to
    512). Lets a clip's JSON say where its other members lie before the tar exists."""
    out: list[int] = []
    position = 0
    for size in sizes:
        out.append(position)
        position += -(-size // TAR_BLOCK) * TAR_BLOCK + TAR_BLOCK
    return out


def frame_times_s_of(pts: NDArray[np.int64], tb: Fraction) -> NDArray[np.float64]:
    """Presentation times (seconds from the first frame, ascending) of a packet index's pts."""
    valid = np.sort(pts[pts != cutting.MISSING])
    if not len(valid):
        return np.zeros(0)
    times: NDArray[np.float64] = (valid - valid[0]).astype(np.float64) * float(tb)
    return times


def pack_first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Pack item indexes into bins of `capacity` bytes, largest first, each into the first bin
    with room. An item bigger than the capacity gets a bin of its own. Bins keep index order."""
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, room in enumerate(free):
            if sizes[i] <= room:
                bins[b].append(i)
                free[b] -= sizes[i]
                break
        else:
            bins.append([i])
            free.append(capacity - sizes[i])
    return [sorted(b) for b in bins]


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes


@dataclass(frozen=True)
class MemberSpan:
    name: str
    offset: int  # byte offset of the member's data inside the tar
    length: int


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_tar(sink: BinaryIO, members: Sequence[tuple[str, int, BinaryIO]]) -> list[MemberSpan]:
    """Stream a deterministic POSIX (ustar) tar of (name, size, source) members into `sink`
    (positioned at 0); returns where each member's data lies."""
    spans: list[MemberSpan] = []
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, size, source in members:
            info = _tar_info(name, size)
            header = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
            offset = sink.tell() + len(header)
            tar.addfile(info, source)
            spans.append(MemberSpan(name, offset, size))
    return spans


def build_tar(members: Sequence[Member]) -> tuple[bytes, list[MemberSpan]]:
    """A deterministic POSIX (ustar) tar of in-memory members, and where each member's data lies."""
    buffer = io.BytesIO()
    spans = write_tar(buffer, [(m.name, len(m.data), io.BytesIO(m.data)) for m in members])
    return buffer.getvalue(), spans


def episode_marker_key(pipeline_version: str, episode_id: str) -> str:
    """Where the shard stage records which shards hold an episode's clips (written last)."""
    return f"shards/{pipeline_version}/episodes/{episode_id}.json"


def shard_keys(pipeline_version: str, sha256: str) -> tuple[str, str]:
    """(shard key, index key): content-addressed, so a rewrite of the same bytes is a no-op."""
    base = f"shards/{pipeline_version}/{sha256[:2]}/{sha256}"
    return f"{base}.tar", f"{base}.index.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def clip_key(episode_id: str, clip_index: int) -> str:
    """A clip's key: the stem of its members' names in the tar (`<clip_key>.mp4`, ...)."""
    return f"{episode_id}_{clip_index:05d}"


def video_member_entry(
    name: str,
    camera: str,
    label: str,
    stream: StreamInfo,
    frame_count: int,
    audio_streams: int,
) -> dict[str, object]:
    """A video member's entry in its clip's `streams` list (placed later by `place_members`).
    `frame_count`: frames shown in the clip's window; `audio_streams`: audio streams muxed in."""
    return {
        "name": name,
        "camera": camera,
        "label": label,
        "kind": "video",
        "stream_index": stream.index,
        "codec": stream.codec,
        "pix_fmt": stream.pix_fmt,
        "width": stream.width,
        "height": stream.height,
        "fps": stream.fps,
        "bit_depth": stream.bit_depth,
        "rotation_deg": stream.rotation_deg,
        "frame_count": frame_count,
        "audio_streams": audio_streams,
    }


def imu_member_entry(name: str, camera: str, sample_count: int) -> dict[str, object]:
    """The IMU slice's entry in its clip's `streams` list (`frame_count` = its sample rows)."""
    return {
        "name": name,
        "camera": camera,
        "label": "imu",
        "kind": "imu",
        "frame_count": sample_count,
    }


def place_members(entries: Sequence[dict[str, object]], sizes: Sequence[int]) -> None:
    """Set each entry's `offset_in_clip` (bytes from the first member's data, as the tar will
    lay them out) and `length` (bytes), for members of these sizes written in this order."""
    if len(entries) != len(sizes):
        raise ValueError(f"{len(entries)} stream entries for {len(sizes)} member files")
    for entry, offset, size in zip(entries, member_offsets(sizes), sizes, strict=True):
        entry["offset_in_clip"] = offset
        entry["length"] = size


def clip_metadata(
    validated: EpisodeValidated,
    clip_index: int,
    window_s: tuple[float, float],
    frame_count: int,
    first_frame: int,
    streams: Sequence[dict[str, object]],
    quality: ClipQuality | None = None,
) -> dict[str, object]:
    """A clip's `.json` member (docs/formats.md): the episode's facts, the clip's window on the
    episode clock (seconds, rounded to microseconds), the main stream's frames in it
    (`frame_count`, from `first_frame` of the episode's), one entry per member, and the clip's
    content signals (`quality`, docs/curation.md) when the validator computed them."""
    decoded = validated.decoded
    episode = decoded.episode
    primary = decoded.streams[decoded.primary_stream]
    start, end = window_s
    return {
        "clip_key": clip_key(episode.episode_id, clip_index),
        "episode_id": episode.episode_id,
        "device_id": episode.device_id,
        "session_id": episode.session_id,
        "clip_index": clip_index,
        "start_s": round(start, 6),
        "duration_s": round(end - start, 6),
        "frame_count": frame_count,
        "first_frame": first_frame,
        "fps": primary.fps,
        "codec": primary.codec,
        "width": primary.width,
        "height": primary.height,
        "raw_key": episode.video.key,
        "raw_sha256": episode.video.sha256,
        "pipeline_version": validated.pipeline_version,
        "format_version": SHARD_FORMAT_VERSION,
        "streams": list(streams),
        **({} if quality is None else {"quality": quality.model_dump(mode="json")}),
    }


def encode_json(document: Mapping[str, object]) -> bytes:
    """A clip's `.json` or a shard index as stored: keys sorted, so the bytes are deterministic."""
    return json.dumps(document, sort_keys=True).encode()


def clip_record(meta: Mapping[str, object], spans: Mapping[str, tuple[int, int]]) -> ClipRecord:
    """The `shards.written` record of one clip: its `.json` metadata plus where each of its
    members lies in the shard (`spans`: member name -> (byte offset, length))."""
    key = str(meta["clip_key"])
    mp4, js = spans[f"{key}.mp4"], spans[f"{key}.json"]
    imu = spans.get(f"{key}.imu.npy")
    return ClipRecord(
        clip_key=key,
        episode_id=str(meta["episode_id"]),
        clip_index=int(str(meta["clip_index"])),
        start_s=float(str(meta["start_s"])),
        duration_s=float(str(meta["duration_s"])),
        frame_count=int(str(meta["frame_count"])),
        mp4_offset=mp4[0],
        mp4_length=mp4[1],
        imu_offset=imu[0] if imu else None,
        imu_length=imu[1] if imu else None,
        json_offset=js[0],
        json_length=js[1],
        quality=None
        if meta.get("quality") is None
        else ClipQuality.model_validate(meta["quality"]),
        members=[
            ClipMember(
                name=str(m["name"]),
                camera=str(m["camera"]),
                kind="imu" if m["kind"] == "imu" else "video",
                stream_index=None if m.get("stream_index") is None else int(str(m["stream_index"])),
                label=str(m["label"]),
                codec=None if m.get("codec") is None else str(m["codec"]),
                pix_fmt=None if m.get("pix_fmt") is None else str(m["pix_fmt"]),
                offset=spans[str(m["name"])][0],
                length=spans[str(m["name"])][1],
                frame_count=int(str(m["frame_count"])),
                audio_streams=int(str(m.get("audio_streams", 0))),
            )
            for m in cast(list[dict[str, object]], meta.get("streams", []))
        ],
    )


def shard_index(
    shard_key: str,
    sha256: str,
    size_bytes: int,
    spans: Sequence[MemberSpan],
    records: Sequence[ClipRecord],
) -> dict[str, object]:
    """The shard's index (`<sha256>.index.json` beside the tar, docs/formats.md): every member's
    byte range and every clip's record, so a reader needs no tar scan."""
    return {
        "format": "egoline-shard-index",
        "version": SHARD_FORMAT_VERSION,
        "shard_key": shard_key,
        "sha256": sha256,
        "size_bytes": size_bytes,
        "members": [{"name": s.name, "offset": s.offset, "length": s.length} for s in spans],
        "clips": [r.model_dump() for r in records],
    }
