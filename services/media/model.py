"""What probing and cutting media produce, as plain data: probe results, the packet index, remux
plans and the domain errors. No PyAV here (services/media/av_io.py is the one module that
imports it), so pure cores (validate rules, decode and shard cores) use these types without it.

Times are seconds (float) unless a name says otherwise (`_tb`: ticks of a stream's time base).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray

from services.media.cutting import PacketRun


class ProbeError(ValueError):
    """The file cannot be opened or demuxed as a video container."""


class RemuxError(RuntimeError):
    """A clip could not be cut out of its episode."""


@dataclass
class StreamProbe:
    """One video stream. Times in seconds; `start_s` is on the file's own clock (first pts),
    every other time list is relative to that first pts."""

    index: int
    codec: str
    width: int
    height: int
    fps: float
    pix_fmt: str | None
    bit_rate: int | None
    rotation_deg: int
    duration_s: float
    frame_count: int
    keyframe_times_s: list[float]
    packet_index: NDArray[np.void] = field(repr=False)
    non_monotonic_count: int
    corrupt_packet_count: int
    max_gap_s: float
    start_s: float = 0.0
    entry_times_s: list[float] = field(default_factory=list)
    clean_cut_times_s: list[float] = field(default_factory=list)
    time_base: Fraction | None = None
    title: str | None = None
    bit_depth: int = 8
    intra_only: bool = False
    jitter_s: float = 0.0
    drift_ppm: float = 0.0
    vfr: bool = False


@dataclass
class AudioProbe:
    """One audio stream: what a clip keeps of it is cut by time."""

    index: int
    codec: str
    sample_rate: int
    channels: int
    start_s: float
    duration_s: float
    packet_count: int


@dataclass
class ContainerProbe:
    format_name: str
    duration_s: float
    complete: bool
    streams: list[StreamProbe] = field(default_factory=list)
    error: str | None = None
    audio: list[AudioProbe] = field(default_factory=list)
    size_bytes: int = 0
    # Set when the file was cut short (power loss mid-write): packets past this byte are not
    # whole, and what lies before it is what the episode keeps.
    salvage_limit_bytes: int | None = None
    salvaged_s: float | None = None


PACKET_INDEX_DTYPE = np.dtype(
    [("pts", "<i8"), ("dts", "<i8"), ("pos", "<i8"), ("size", "<i4"), ("keyframe", "?")]
)


@dataclass
class KeyframeCheck:
    decoded: int
    failed: int
    first_error: str | None
    still_spans_s: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class MemberPlan:
    """One output file per clip: a video stream (plus audio streams) of one source file.

    `runs[i]` is the packet run (decode indexes) of the video stream for clip i, `None` for
    no frames; `offsets_tb[i]` is the clip window start in the video stream's time base (it
    becomes timestamp 0); `audio_windows[a][i]` is audio stream a's window [start, end) for
    clip i in its own time base.
    """

    video_index: int
    container: str  # "mp4" or "matroska"
    runs: list[PacketRun | None]
    offsets_tb: list[int]
    audio_windows: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
