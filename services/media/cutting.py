"""Pure clip-cutting logic over a stream's packet index (no PyAV here).

A clip is a time window [start, end) of the episode. For each stream, the clip holds a
contiguous run of packets in *decode order* that lets every frame of the window decode on its
own, without re-encoding:
- it starts at the last *entry point* at or before the window start: a keyframe that no earlier
  packet (in decode order) is displayed after. Frames between that entry point and the window
  start are pre-roll: their timestamps come out negative and the MP4 muxer hides them behind an
  edit list (FFmpeg-based readers drop them);
- the keyframe's own *leading pictures* (open GOP: an HEVC CRA's RASL frames, decoded after it
  but displayed before it, referencing the previous GOP) are left out: they cannot decode
  without the GOP before, and they belong to the previous clip's window;
- it ends at the last packet, in decode order, displayed before the window end. Reference
  frames decoded before that packet but displayed at or after the end are carried along
  (typically one frame: the next clip's first keyframe, when it is an open-GOP CRA).

Timestamps here are integers in the stream's time base, in decode order; missing ones are
INT64_MIN (as in `PACKET_INDEX_DTYPE`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from schemas.events import EpisodeDecoded

MISSING = np.iinfo(np.int64).min


@dataclass(frozen=True)
class PacketRun:
    """Packets of one stream for one clip: decode indexes [first, last], minus `skipped`
    (the entry keyframe's leading pictures)."""

    first: int
    last: int
    skipped: frozenset[int] = frozenset()

    def __contains__(self, index: object) -> bool:
        return (
            isinstance(index, int)
            and self.first <= index <= self.last
            and (index not in self.skipped)
        )

    @property
    def count(self) -> int:
        return self.last - self.first + 1 - len(self.skipped)


def _valid(pts: NDArray[np.int64]) -> NDArray[np.bool_]:
    valid: NDArray[np.bool_] = pts != MISSING
    return valid


def entry_points(pts: NDArray[np.int64], keyframe: NDArray[np.bool_]) -> NDArray[np.intp]:
    """Decode indexes of keyframes where decoding may start: no earlier packet is displayed at or
    after the keyframe (which would need frames from before it)."""
    valid = _valid(pts)
    masked = np.where(valid, pts, MISSING)
    prefix_max = np.maximum.accumulate(np.concatenate([[MISSING], masked[:-1]]))
    return np.flatnonzero(keyframe & valid & (prefix_max < pts))


def clean_cuts(pts: NDArray[np.int64], keyframe: NDArray[np.bool_]) -> NDArray[np.intp]:
    """Entry points with no leading pictures either: a clip may start or end there and hold
    exactly its window's frames (closed GOP, IDR). Open-GOP CRA keyframes are not clean."""
    entries = entry_points(pts, keyframe)
    big = np.iinfo(np.int64).max
    masked = np.where(_valid(pts), pts, big)
    suffix_min = np.minimum.accumulate(masked[::-1])[::-1]
    after = np.concatenate([suffix_min[1:], [big]])
    return entries[after[entries] > pts[entries]]


def leading_pictures(pts: NDArray[np.int64], entry: int, next_entry: int | None) -> list[int]:
    """Decode indexes after `entry` (up to the next entry point) displayed before it."""
    stop = len(pts) if next_entry is None else next_entry
    window = pts[entry + 1 : stop]
    hits = np.flatnonzero(_valid(window) & (window < pts[entry]))
    return [int(entry + 1 + h) for h in hits]


def plan_runs(
    pts: NDArray[np.int64],
    keyframe: NDArray[np.bool_],
    windows: list[tuple[int, int]],
) -> list[PacketRun | None]:
    """For each window [start, end) (stream time base), the packet run that decodes it whole;
    None when the stream shows no frame in that window. Windows must ascend and not overlap.

    Frames displayed before the first entry point of the stream cannot be decoded by anyone;
    a window whose frames all lie before it gets None.
    """
    entries = entry_points(pts, keyframe)
    valid = _valid(pts)
    runs: list[PacketRun | None] = []
    for start, end in windows:
        shown = np.flatnonzero(valid & (pts >= start) & (pts < end))
        if len(shown) == 0:
            runs.append(None)
            continue
        last = int(shown.max())
        # The entry point: the last one displayed at or before the window start, else the first
        # one inside the window.
        at_or_before = entries[pts[entries] <= start] if len(entries) else entries
        if len(at_or_before):
            entry = int(at_or_before[-1])
        else:
            inside = entries[(pts[entries] >= start) & (pts[entries] < end)]
            if not len(inside):
                runs.append(None)
                continue
            entry = int(inside[0])
        following = entries[entries > entry]
        nxt = int(following[0]) if len(following) else None
        skipped = frozenset(leading_pictures(pts, entry, nxt))
        if last < entry:
            runs.append(None)
            continue
        runs.append(PacketRun(entry, last, skipped))
    return runs


def plan_clips(
    cut_candidates_s: list[float], start_s: float, end_s: float, target_s: float
) -> list[tuple[float, float]]:
    """Cut the episode span [start_s, end_s) into windows of about `target_s` seconds at cut
    candidates (the primary stream's keyframe times, clean ones preferred by the caller).

    A window runs from its start to the first candidate at or past start + target, so windows
    are never shorter than the target except the last; a last piece shorter than half the target
    is merged into the one before.
    """
    if target_s <= 0:
        raise ValueError("target_s must be positive")
    if end_s <= start_s:
        return []
    cuts = [start_s]
    for k in sorted(c for c in cut_candidates_s if start_s < c < end_s):
        if k - cuts[-1] >= target_s - 1e-6:
            cuts.append(k)
    if len(cuts) > 1 and end_s - cuts[-1] < target_s / 2:
        cuts.pop()
    cuts.append(end_s)
    return list(itertools.pairwise(cuts))


@dataclass(frozen=True)
class EpisodeClock:
    """The episode clock: seconds from the earliest frame of any camera, so nothing any camera
    recorded falls before the first clip. `origin_s` is that frame's time on the main file's
    clock (each camera's own clock shifted by its `offset_s`); `end_s` the last frame's end on
    the episode clock; `starts_s` each (camera, stream index)'s first frame on it."""

    origin_s: float
    end_s: float
    starts_s: dict[tuple[str, int], float]

    def primary_shift_s(self, decoded: EpisodeDecoded) -> float:
        """Where the main stream's first frame lies on the episode clock (its keyframe times
        and the IMU, both on that stream's clock, move by this)."""
        return self.starts_s[
            (decoded.episode.camera, decoded.streams[decoded.primary_stream].index)
        ]


def episode_clock(decoded: EpisodeDecoded) -> EpisodeClock:
    """The clock every stream of every camera of `decoded` shares (see `EpisodeClock`)."""
    files = [(decoded.episode.camera, 0.0, decoded.streams)] + [
        (c.name, c.offset_s, c.streams) for c in decoded.cameras
    ]
    origin = min(s.start_s + offset for _, offset, streams in files for s in streams)
    end = max(s.start_s + offset + s.duration_s for _, offset, streams in files for s in streams)
    return EpisodeClock(
        origin_s=origin,
        end_s=end - origin,
        starts_s={
            (camera, s.index): s.start_s + offset - origin
            for camera, offset, streams in files
            for s in streams
        },
    )


def clip_windows(
    decoded: EpisodeDecoded, clock: EpisodeClock, target_s: float
) -> list[tuple[float, float]]:
    """The episode's clips as [start, end) windows on its clock: cut at the main stream's
    keyframes into about `target_s` seconds each (`plan_clips`). The shard stage cuts at these;
    validate's reject mode judges the same windows."""
    shift = clock.primary_shift_s(decoded)
    return plan_clips([t + shift for t in decoded.keyframe_times_s], 0.0, clock.end_s, target_s)
