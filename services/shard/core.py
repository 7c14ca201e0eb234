"""Pure shard logic: GOP-aligned clip boundaries, first-fit-decreasing packing, tar layout.

Shard format (WebDataset-compatible POSIX tar, documented in docs/formats.md): per clip three
members `<clip_key>.mp4`, `<clip_key>.imu.npy` (when the episode has IMU) and `<clip_key>.json`,
grouped by key in clip order; every header is deterministic (mtime 0, uid/gid 0, mode 0644) so
the same clips give byte-identical shards and so the same content-addressed key.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from services.media import cutting

# 2: one member per video stream (`<key>.<label>.mp4|mkv` beside `<key>.mp4`), the IMU slice
# as (M, 7) float64 [t from clip start, ax, ay, az, gx, gy, gz], a `streams` list in the JSON.
SHARD_FORMAT_VERSION = 2
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
