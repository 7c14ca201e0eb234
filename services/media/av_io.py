"""Every use of PyAV in egoline lives here ("PyAV in one place").

Time units: PyAV packet `pts`/`dts` are integers in the stream's `time_base` (a Fraction of a
second); everything this module returns is in seconds (float) unless a name says otherwise.
The plain data it returns and raises (probe results, remux plans, errors) is defined in
services/media/model.py, which does not import PyAV, so pure cores can use those types.
"""

from __future__ import annotations

import io
import itertools
import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import av.audio.stream
import av.error
import av.stream
import numpy as np
from av.container import OutputContainer
from av.video.stream import VideoStream
from numpy.typing import NDArray

from services.media.cutting import PacketRun, clean_cuts, entry_points, plan_runs
from services.media.model import (
    PACKET_INDEX_DTYPE,
    AudioProbe,
    ContainerProbe,
    KeyframeCheck,
    MemberPlan,
    ProbeError,
    RemuxError,
    StreamProbe,
)
from services.media.signals import SIGNAL_WIDTH, SignalSampler, still_spans

logging.getLogger("libav").setLevel(logging.CRITICAL)
av.logging.set_level(av.logging.PANIC)


ENCODERS = {"h264": "libx264", "h265": "libx265", "av1": "libsvtav1"}


@dataclass
class EncodeStream:
    """One video stream to encode; `frames` yields HxWx3 uint8 RGB arrays, or, with
    `yuv=True`, ready (H*3/2, W) planar YUV 4:2:0 arrays."""

    frames: Iterable[NDArray[np.uint8]]
    codec: str = "h264"
    width: int = 320
    height: int = 240
    yuv: bool = False
    crf: int = 23


def encode_video(
    path: Path, streams: list[EncodeStream], fps: int, gop: int, container_format: str | None = None
) -> int:
    """Encode the streams (interleaved frame by frame) into `path`; returns frames per stream.

    A fixed GOP of `gop` frames (keyframe every gop/fps seconds) and no scene-cut keyframes keep
    the output deterministic and clips GOP-aligned.
    """
    # bitexact: no random Matroska segment UID or muxer version string, so equal input gives
    # byte-identical files.
    with av.open(
        str(path), mode="w", format=container_format, options={"fflags": "+bitexact"}
    ) as out:
        encoders = []
        for spec in streams:
            stream = cast(VideoStream, out.add_stream(ENCODERS[spec.codec], rate=fps))
            stream.width = spec.width
            stream.height = spec.height
            stream.pix_fmt = "yuv420p"
            stream.codec_context.gop_size = gop
            # One encoder thread: frame-threaded rate control makes x264/x265 output vary.
            stream.codec_context.thread_count = 1
            if spec.codec == "h264":
                stream.codec_context.options = {
                    # ultrafast + one thread: faster presets' lookahead made output vary between
                    # runs here, and synthetic episodes must be reproducible byte for byte.
                    "preset": "ultrafast",
                    "x264-params": (
                        f"keyint={gop}:min-keyint={gop}:scenecut=0:threads=1:sync-lookahead=0"
                    ),
                }
            elif spec.codec == "h265":
                stream.codec_context.options = {
                    "preset": "ultrafast",
                    "x265-params": (
                        f"keyint={gop}:min-keyint={gop}:scenecut=0:log-level=error:pools=1"
                    ),
                }
            else:
                stream.codec_context.options = {"preset": "12", "svtav1-params": f"keyint={gop}"}
            stream.codec_context.options = {
                **stream.codec_context.options,
                **({"crf": str(spec.crf)} if spec.codec != "av1" else {}),
            }
            encoders.append((stream, iter(spec.frames), spec))
        count = 0
        while True:
            done = 0
            for stream, frames, spec in encoders:
                array = next(frames, None)
                if array is None:
                    done += 1
                    continue
                # Convert in numpy, not swscale: swscale's first conversion in a process can
                # differ from later ones, which would make synthetic files non-reproducible.
                planes = array if spec.yuv else rgb_to_yuv420p(array)
                frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
                # Explicit timestamps (time_base 1/fps); unset, x264 output varies run to run.
                frame.pts = count
                frame.time_base = Fraction(1, fps)
                out.mux(stream.encode(frame))
            if done == len(encoders):
                break
            count += 1
        for stream, _, _ in encoders:
            out.mux(stream.encode(None))
    return count


def rgb_to_yuv420p(rgb: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """BT.601 limited-range RGB -> planar YUV 4:2:0, as the (H*3/2, W) array PyAV expects.

    Height and width must be even.
    """
    h, w, _ = rgb.shape
    if h % 2 or w % 2:
        raise ValueError(f"yuv420p needs even dimensions, got {w}x{h}")
    f = rgb.astype(np.int32)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16
    u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128
    v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128
    u = u.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).round().astype(np.int32)
    v = v.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).round().astype(np.int32)
    out = np.empty((h * 3 // 2, w), dtype=np.uint8)
    out[:h] = np.clip(y, 0, 255)
    out[h : h + h // 4] = np.clip(u, 0, 255).reshape(h // 4, w)
    out[h + h // 4 :] = np.clip(v, 0, 255).reshape(h // 4, w)
    return out


def _seconds(value: int | None, time_base: Fraction | None) -> float:
    if value is None or time_base is None:
        return 0.0
    return float(value * time_base)


# The probe keeps ~100 bytes per packet: this bounds its memory at a few hundred MB whatever
# the file claims (18.5 h of 30 fps video; a file of millions of tiny packets is hostile).
MAX_PACKETS = 2_000_000
# Codecs whose every frame is a keyframe (no inter prediction): cut anywhere.
INTRA_ONLY_CODECS = frozenset({"mjpeg", "png", "rawvideo", "prores", "utvideo", "huffyuv"})


@dataclass
class _PacketLog:
    """Timestamps (in the stream's time_base) of every packet of one stream, in demux order."""

    dts: list[int | None] = field(default_factory=list)
    pts: list[int | None] = field(default_factory=list)
    durations: list[int] = field(default_factory=list)
    keyframes: list[int | None] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    key_flags: list[bool] = field(default_factory=list)
    corrupt_flags: list[bool] = field(default_factory=list)

    @property
    def corrupt(self) -> int:
        return sum(self.corrupt_flags)

    def truncate_at(self, limit: int) -> None:
        """Drop the packets whose bytes reach past `limit` (and everything after them in
        decode order: a decode-order prefix always decodes)."""
        keep = len(self.positions)
        for i, (pos, size) in enumerate(zip(self.positions, self.sizes, strict=True)):
            if pos >= 0 and pos + size > limit:
                keep = i
                break
        for name in ("dts", "pts", "durations", "positions", "sizes", "key_flags", "corrupt_flags"):
            del getattr(self, name)[keep:]
        self.keyframes = [p for p, k in zip(self.pts, self.key_flags, strict=True) if k]


@dataclass(frozen=True)
class _StreamMeta:
    """What the probe needs of a stream, copied while the container is open."""

    index: int
    kind: str
    time_base: Fraction | None
    rate: Fraction | None
    codec: str
    width: int
    height: int
    pix_fmt: str | None
    bit_rate: int | None
    metadata: dict[str, str]
    sample_rate: int
    channels: int


def _stream_meta(stream: av.stream.Stream) -> _StreamMeta:
    ctx = stream.codec_context
    video = isinstance(stream, VideoStream)
    rate = (stream.average_rate or stream.guessed_rate) if video else None
    return _StreamMeta(
        index=stream.index,
        kind=str(stream.type),
        time_base=stream.time_base,
        rate=rate,
        codec=canonical_codec(stream),
        width=int(getattr(ctx, "width", 0) or 0),
        height=int(getattr(ctx, "height", 0) or 0),
        pix_fmt=_pix_fmt(stream),
        bit_rate=int(ctx.bit_rate) if ctx.bit_rate else None,
        metadata=dict(stream.metadata),
        sample_rate=int(getattr(ctx, "sample_rate", 0) or 0),
        channels=int(getattr(ctx, "channels", 0) or 0),
    )


@dataclass
class _Demuxed:
    format_name: str
    header_duration_s: float
    videos: list[_StreamMeta]
    audio: list[_StreamMeta]
    logs: dict[int, _PacketLog]
    error: str | None
    size_bytes: int


def _demux_index(path: Path, max_packets: int, with_audio: bool = True) -> _Demuxed:
    """One demux pass (no decoding) logging every packet's timestamps and byte range."""
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise ProbeError(f"cannot open container: {exc}") from exc
    with container:
        videos = list(container.streams.video)
        if not videos:
            raise ProbeError("no video stream")
        audio = list(container.streams.audio) if with_audio else []
        header_duration = (container.duration or 0) / 1_000_000  # AV_TIME_BASE is microseconds
        logs = {s.index: _PacketLog() for s in [*videos, *audio]}
        error: str | None = None
        count = 0
        try:
            for packet in container.demux([*videos, *audio]):
                if packet.size == 0:  # flush packet at end of stream
                    continue
                count += 1
                if count > max_packets:
                    raise ProbeError(f"more than {max_packets} video and audio packets")
                entry = logs[packet.stream.index]
                entry.dts.append(packet.dts)
                entry.pts.append(packet.pts)
                entry.durations.append(packet.duration or 0)
                entry.positions.append(packet.pos if packet.pos is not None else -1)
                entry.sizes.append(packet.size)
                entry.key_flags.append(bool(packet.is_keyframe))
                if packet.is_keyframe:
                    entry.keyframes.append(packet.pts)
                entry.corrupt_flags.append(bool(packet.is_corrupt))
        except av.error.FFmpegError as exc:
            error = f"demux stopped early: {exc}"
        fmt = str(container.format.name)
        video_meta = [_stream_meta(v) for v in videos]
        audio_meta = [_stream_meta(a) for a in audio]
    return _Demuxed(fmt, header_duration, video_meta, audio_meta, logs, error, path.stat().st_size)


def _salvage_limit(size: int) -> int:
    """The byte offset up to which a cut-short file holds whole packets: a demuxer hands out the
    packet that straddles the cut shortened to what is there (fragmented MP4: its sample table
    in the `moof` says more), so a packet that reaches the very last byte is dropped; every
    packet before it is whole. What is kept is a prefix in decode order, which always decodes."""
    return size - 1


def probe_container(path: Path, max_packets: int = MAX_PACKETS) -> ContainerProbe:
    """Demux every packet (no decoding) and index each video stream's GOPs and timestamps.

    A file cut short mid-write (power loss) keeps its whole packets: `salvage_limit_bytes` and
    `salvaged_s` say how much. Raises ProbeError when the file is not a readable video
    container at all, or holds more than `max_packets` packets.
    """
    demuxed = _demux_index(path, max_packets)
    videos = demuxed.videos
    primary_log = demuxed.logs[videos[0].index]
    first_streams = [_stream_probe(s, demuxed.logs[s.index]) for s in videos]
    primary = first_streams[0]
    duration = demuxed.header_duration_s or primary.duration_s
    # Complete: demux reached the end cleanly and the packets cover the duration the header
    # announces (a truncated MKV/WebM keeps its header but loses its tail).
    covers = primary.duration_s >= duration - max(0.5, 2.0 / max(primary.fps, 1.0))
    complete = demuxed.error is None and covers
    limit: int | None = None
    salvaged: float | None = None
    if not complete and primary_log.pts:
        limit = _salvage_limit(demuxed.size_bytes)
        for log in demuxed.logs.values():
            log.truncate_at(limit)
    streams = (
        first_streams
        if limit is None
        else [_stream_probe(s, demuxed.logs[s.index]) for s in videos]
    )
    for stream in streams:
        if not stream.rotation_deg:
            stream.rotation_deg = display_rotation(path, stream.index, stream.width, stream.height)
    if limit is not None:
        salvaged = streams[0].duration_s
    return ContainerProbe(
        format_name=demuxed.format_name,
        duration_s=duration,
        complete=complete,
        streams=streams,
        error=demuxed.error,
        audio=[_audio_probe(a, demuxed.logs[a.index]) for a in demuxed.audio],
        size_bytes=demuxed.size_bytes,
        salvage_limit_bytes=limit,
        salvaged_s=salvaged,
    )


# Only frames up to this size are decoded to read their display matrix (a hostile header must
# not make the probe allocate gigabytes; validate's own size guard comes later).
ROTATION_MAX_PIXELS = 7680 * 4320


def display_rotation(path: Path, stream_index: int, width: int, height: int) -> int:
    """Degrees the display matrix rotates the stream by (phones write 90/180/270). FFmpeg 8 keeps
    it as packet side data that PyAV exposes on decoded frames only, so the first frame is
    decoded; 0 when there is none or the stream is too large to decode safely."""
    if not 0 < width * height <= ROTATION_MAX_PIXELS:
        return 0
    try:
        with av.open(str(path)) as container:
            stream = container.streams[stream_index]
            for frame in container.decode(stream):
                return round(float(getattr(frame, "rotation", 0) or 0)) % 360
    except (av.error.FFmpegError, ValueError):
        return 0
    return 0


def frame_times_s(stream: StreamProbe) -> NDArray[np.float64]:
    """Presentation times of a probed stream's frames, ascending, seconds from its first one."""
    pts = stream.packet_index["pts"]
    pts = np.sort(pts[pts != np.iinfo(np.int64).min])
    if not len(pts) or stream.time_base is None:
        return np.zeros(0)
    times: NDArray[np.float64] = (pts - pts[0]).astype(np.float64) * float(stream.time_base)
    return times


def time_bases(path: Path) -> dict[int, Fraction]:
    """The time base (seconds per tick) of every stream of a container."""
    with av.open(str(path)) as container:
        return {s.index: s.time_base or Fraction(1, 90_000) for s in container.streams}


def packet_indexes(
    path: Path, salvage_limit_bytes: int | None = None, max_packets: int = MAX_PACKETS
) -> dict[int, NDArray[np.void]]:
    """The packet index of every video and audio stream (decode order), cut at the salvage
    limit the probe found, so the shard stage plans clips on exactly the packets decode saw."""
    demuxed = _demux_index(path, max_packets)
    if salvage_limit_bytes is not None:
        for log in demuxed.logs.values():
            log.truncate_at(salvage_limit_bytes)
    return {index: packet_table(log) for index, log in demuxed.logs.items()}


def packet_table(entry: _PacketLog) -> NDArray[np.void]:
    """The GOP/packet index of one stream as a structured array (one row per packet, demux
    order; pts/dts in the stream's time_base, missing ones as INT64_MIN; pos = byte offset in
    the file, -1 if unknown)."""
    missing = np.iinfo(np.int64).min
    table = np.zeros(len(entry.pts), dtype=PACKET_INDEX_DTYPE)
    table["pts"] = [missing if v is None else v for v in entry.pts]
    table["dts"] = [missing if v is None else v for v in entry.dts]
    table["pos"] = entry.positions
    table["size"] = entry.sizes
    table["keyframe"] = entry.key_flags
    return table


def canonical_codec(stream: av.stream.Stream) -> str:
    """The codec's own name (h264, hevc, av1, ffv1...), never the decoder's (libdav1d)."""
    codec = stream.codec_context.codec
    return str(getattr(codec, "canonical_name", None) or codec.name)


def _rotation(meta: _StreamMeta) -> int:
    try:
        return int(meta.metadata.get("rotate", "0"))
    except ValueError:
        return 0


def _bit_depth(pix_fmt: str | None) -> int:
    if not pix_fmt:
        return 8
    try:
        return int(av.VideoFormat(pix_fmt).components[0].bits)
    except (ValueError, IndexError):
        return 8


def _stream_probe(stream: _StreamMeta, entry: _PacketLog) -> StreamProbe:
    tb = stream.time_base
    dts = [d for d in entry.dts if d is not None]
    pts = sorted(p for p in entry.pts if p is not None)
    non_monotonic = sum(1 for a, b in itertools.pairwise(dts) if b <= a)
    gaps = [_seconds(b - a, tb) for a, b in itertools.pairwise(pts)]
    last_dur = entry.durations[-1] if entry.durations else 0
    if pts and not last_dur and gaps:
        last_dur = round(float(np.median(gaps)) / float(tb)) if tb else 0
    duration = _seconds(pts[-1] - pts[0] + last_dur, tb) if pts else 0.0
    rate = stream.rate
    fps = float(rate) if rate else 0.0
    codec = stream.codec
    table = packet_table(entry)
    origin = pts[0] if pts else 0
    key = table["keyframe"]
    entries = entry_points(table["pts"], key) if len(table) else np.array([], dtype=np.intp)
    cleans = clean_cuts(table["pts"], key) if len(table) else np.array([], dtype=np.intp)
    jitter = float(np.std(gaps)) if len(gaps) > 1 else 0.0
    mean_gap = float(np.mean(gaps)) if gaps else 0.0
    drift = (mean_gap * fps - 1.0) * 1e6 if fps and mean_gap else 0.0
    median_gap = float(np.median(gaps)) if gaps else 0.0
    vfr = bool(gaps) and max(gaps) - min(gaps) > 0.01 * max(median_gap, 1e-9)
    return StreamProbe(
        index=stream.index,
        codec=codec,
        width=stream.width,
        height=stream.height,
        fps=fps,
        pix_fmt=stream.pix_fmt,
        bit_rate=stream.bit_rate,
        rotation_deg=_rotation(stream),
        duration_s=duration,
        frame_count=len(entry.pts),
        keyframe_times_s=sorted(_seconds(k - origin, tb) for k in entry.keyframes if k is not None),
        non_monotonic_count=non_monotonic,
        corrupt_packet_count=entry.corrupt,
        max_gap_s=max(gaps, default=0.0),
        packet_index=table,
        start_s=_seconds(origin, tb),
        entry_times_s=sorted(_seconds(int(table["pts"][i]) - origin, tb) for i in entries),
        clean_cut_times_s=sorted(_seconds(int(table["pts"][i]) - origin, tb) for i in cleans),
        time_base=tb,
        title=stream.metadata.get("title") or None,
        bit_depth=_bit_depth(stream.pix_fmt),
        intra_only=codec in INTRA_ONLY_CODECS,
        jitter_s=jitter,
        drift_ppm=drift,
        vfr=vfr,
    )


def _audio_probe(stream: _StreamMeta, entry: _PacketLog) -> AudioProbe:
    tb = stream.time_base
    pts = sorted(p for p in entry.pts if p is not None)
    last = entry.durations[-1] if entry.durations else 0
    return AudioProbe(
        index=stream.index,
        codec=stream.codec,
        sample_rate=stream.sample_rate,
        channels=stream.channels,
        start_s=_seconds(pts[0], tb) if pts else 0.0,
        duration_s=_seconds(pts[-1] - pts[0] + last, tb) if pts else 0.0,
        packet_count=len(entry.pts),
    )


def decode_keyframes(
    path: Path,
    stream_index: int,
    full: bool = False,
    salvage_limit_bytes: int | None = None,
    sampler: SignalSampler | None = None,
    still_bits_per_pixel: float | None = None,
) -> KeyframeCheck:
    """Decode only the keyframes of one stream (or every frame when `full`).

    One pass sends every packet (skip_frame=NONKEY: non-key packets are only parsed, which
    still catches garbage where a keyframe flag was lost). When fewer frames come out than
    there are keyframes and the decoder raised nothing, the shortfall may only be frames the
    decoder still holds (B-frame reordering, frame threads, HEVC output bumping): a second pass
    then decodes each keyframe on its own (sent, drained, reset), so the verdict never depends on
    a decoder's output delay. A file cut short is checked up to its salvage limit.

    Curation rides on the same pass: the decoded frames go to `sampler` (8-bit luma,
    SIGNAL_WIDTH wide, times in seconds from the stream's first pts), and with
    `still_bits_per_pixel` the packet sizes give the stream's still (frozen) spans.
    """
    first = _keyframe_pass(
        path, stream_index, full, salvage_limit_bytes, isolated=False, sampler=sampler
    )
    spans: list[tuple[float, float]] = []
    if still_bits_per_pixel is not None and first.width and first.height:
        spans = still_spans(
            np.asarray(first.packet_pts, dtype=np.float64) * first.time_base - first.origin_s,
            np.asarray(first.packet_sizes, dtype=np.int64),
            np.asarray(first.packet_key, dtype=np.bool_),
            first.width * first.height,
            still_bits_per_pixel,
        )
        if sampler is not None and spans and not first.failed:
            _sample_still_spans(path, stream_index, spans, sampler, salvage_limit_bytes)
    if full or first.failed or first.decoded >= first.keyframes:
        return KeyframeCheck(first.decoded, first.failed, first.first_error, spans)
    second = _keyframe_pass(path, stream_index, full, salvage_limit_bytes, isolated=True)
    return KeyframeCheck(second.decoded, second.failed, second.first_error, spans)


@dataclass
class _PassResult:
    decoded: int = 0
    failed: int = 0
    keyframes: int = 0
    first_error: str | None = None
    width: int = 0
    height: int = 0
    time_base: float = 0.0
    origin_s: float = 0.0
    packet_pts: list[int] = field(default_factory=list)
    packet_sizes: list[int] = field(default_factory=list)
    packet_key: list[bool] = field(default_factory=list)


def _sample_frames(
    frames: Iterable[av.VideoFrame],
    sampler: SignalSampler | None,
    base: Fraction | None,
    origin_s: float,
    force: bool = False,
) -> None:
    """Hand decoded frames to the sampler. Times from pts and the stream's time base: frames
    drained at the end of a pass carry their pts but no time base (`frame.time` is NaN)."""
    if sampler is None or base is None:
        return
    for frame in frames:
        if frame.pts is None:
            continue
        t_s = float(frame.pts * base) - origin_s
        if not force and not sampler.wants(t_s):
            continue
        height = max(2, round(frame.height * SIGNAL_WIDTH / max(1, frame.width) / 2) * 2)
        gray = frame.reformat(width=SIGNAL_WIDTH, height=height, format="gray")
        luma = np.asarray(gray.to_ndarray(), dtype=np.uint8)
        if force:
            sampler.insert(t_s, luma)
        else:
            sampler.add(t_s, luma)


# A still span shows one picture: what it shows (a covered lens, a frozen scene) is read from
# one decoded frame in its middle. At most this many spans per stream are looked into.
MAX_STILL_SAMPLES = 4


def _sample_still_spans(
    path: Path,
    stream_index: int,
    spans: list[tuple[float, float]],
    sampler: SignalSampler,
    salvage_limit_bytes: int | None,
) -> None:
    """Decode the frame in the middle of each still span (the keyframe pass does not show
    what a span holds: no keyframe need fall in it) and add it to the sampler. Seeks to the
    keyframe before it and decodes forward; a still span's inter frames are near-empty, so
    this costs about one keyframe each. An error here only leaves the sample out."""
    with av.open(str(path)) as container:
        stream = cast(VideoStream, container.streams[stream_index])
        base = stream.time_base
        if base is None:
            return
        origin_s = float(stream.start_time * base) if stream.start_time else 0.0
        for start, end in spans[:MAX_STILL_SAMPLES]:
            target = (start + end) / 2
            try:
                container.seek(int((target + origin_s) / base), stream=stream, backward=True)
                for packet in container.demux(stream):
                    if salvage_limit_bytes is not None and (
                        packet.pos is not None and packet.pos + packet.size > salvage_limit_bytes
                    ):
                        break
                    hit = [
                        f
                        for f in packet.decode()
                        if f.pts is not None and float(f.pts * base) - origin_s >= target
                    ]
                    if hit:
                        _sample_frames(hit[:1], sampler, base, origin_s, force=True)
                        break
            except av.error.FFmpegError:
                continue


def _keyframe_pass(
    path: Path,
    stream_index: int,
    full: bool,
    salvage_limit_bytes: int | None,
    isolated: bool,
    sampler: SignalSampler | None = None,
) -> _PassResult:
    result = _PassResult()
    with av.open(str(path)) as container:
        stream = cast(VideoStream, container.streams[stream_index])
        ctx = stream.codec_context
        result.width, result.height = ctx.width, ctx.height
        base = stream.time_base
        # seconds of the stream's first pts: signal times are relative to it (as keyframe_times)
        origin_s = float(stream.start_time * base) if stream.start_time and base else 0.0
        result.time_base, result.origin_s = float(base or 0), origin_s
        if not full:
            ctx.skip_frame = "NONKEY"
            # The deblocking filter only smooths reconstructed pixels; skipping it saves ~25% of
            # keyframe decode time and still catches every bitstream error.
            ctx.options = {"skip_loop_filter": "all"}
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            if salvage_limit_bytes is not None and (
                packet.pos is not None and packet.pos + packet.size > salvage_limit_bytes
            ):
                break
            result.keyframes += bool(packet.is_keyframe)
            if not isolated and packet.pts is not None:
                result.packet_pts.append(packet.pts)  # ints: seconds are computed once, at the end
                result.packet_sizes.append(packet.size)
                result.packet_key.append(bool(packet.is_keyframe))
            if isolated and not packet.is_keyframe:
                continue
            try:
                if packet.is_corrupt:
                    raise av.error.InvalidDataError(0, "corrupt packet flag")
                frames = packet.decode()
                if isolated:
                    frames += ctx.decode(None)
                    ctx.flush_buffers()
                    result.decoded += min(1, len(frames))
                else:
                    result.decoded += len(frames)
                    _sample_frames(frames, sampler, base, origin_s)
            except av.error.FFmpegError as exc:
                result.failed += 1
                result.first_error = result.first_error or str(exc)
                if isolated:
                    ctx.flush_buffers()
        if not isolated:
            try:
                held = stream.decode(None)  # drain frames the decoder holds
                result.decoded += len(held)
                _sample_frames(held, sampler, base, origin_s)
            except av.error.FFmpegError as exc:
                result.failed += 1
                result.first_error = result.first_error or str(exc)
    return result


# FFmpeg's MP4 muxer carries these video codecs (FFV1 too: 16-bit depth stays lossless, and
# the MP4 edit list hides pre-roll, which Matroska cannot) and these audio codecs beside them;
# anything else goes into a Matroska member.
MP4_VIDEO_CODECS = frozenset({"h264", "hevc", "av1", "mpeg4", "vp9", "ffv1"})
MP4_AUDIO_CODECS = frozenset({"aac", "opus", "mp3", "ac3", "eac3", "flac", "alac"})


def member_container(video_codec: str, audio_codecs: Iterable[str]) -> str:
    """MP4 when it can carry the codecs, else Matroska."""
    if video_codec in MP4_VIDEO_CODECS and all(a in MP4_AUDIO_CODECS for a in audio_codecs):
        return "mp4"
    return "matroska"


def remux_members(
    path: Path, plans: list[MemberPlan], clip_count: int, out_dir: Path, prefix: str
) -> list[list[tuple[Path, int] | None]]:
    """Cut every planned member of every clip out of `path` in one demux pass, without
    re-encoding. Writes `out_dir/<prefix>-<clip>-<member>` files; returns, per clip and per
    plan, (file, video packets) or None where the stream has no frame in that clip."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[list[tuple[Path, int] | None]] = [[None] * len(plans) for _ in range(clip_count)]
    counts = [[0] * len(plans) for _ in range(clip_count)]
    outputs: dict[tuple[int, int], tuple[OutputContainer, dict[int, av.stream.Stream]]] = {}
    decode_no: dict[int, int] = {}
    wanted = {p.video_index for p in plans} | {a for p in plans for a in p.audio_windows}
    with av.open(str(path)) as source:
        by_index = {s.index: s for s in source.streams}

        def output(clip: int, m: int) -> tuple[OutputContainer, dict[int, av.stream.Stream]]:
            if (clip, m) not in outputs:
                plan = plans[m]
                ext = "mp4" if plan.container == "mp4" else "mkv"
                file = out_dir / f"{prefix}-{clip:05d}-{m:02d}.{ext}"
                options = {"fflags": "+bitexact"}
                out = av.open(str(file), mode="w", format=plan.container, options=options)
                mapping = {
                    plan.video_index: out.add_stream_from_template(
                        by_index[plan.video_index], opaque=True
                    )
                }
                for a in sorted(plan.audio_windows):
                    mapping[a] = out.add_stream_from_template(by_index[a], opaque=True)
                outputs[(clip, m)] = (out, mapping)
                results[clip][m] = (file, 0)
            return outputs[(clip, m)]

        try:
            for packet in source.demux([by_index[i] for i in sorted(wanted)]):
                if packet.size == 0 or packet.pts is None:
                    continue
                index = packet.stream.index
                number = decode_no.get(index, 0)
                decode_no[index] = number + 1
                for m, plan in enumerate(plans):
                    if index == plan.video_index:
                        for clip, run in enumerate(plan.runs):
                            if isinstance(run, PacketRun) and number in run:
                                _mux_shifted(packet, output(clip, m), index, plan.offsets_tb[clip])
                                counts[clip][m] += 1
                    elif index in plan.audio_windows:
                        for clip, (start, end) in enumerate(plan.audio_windows[index]):
                            if start <= packet.pts < end and plan.runs[clip] is not None:
                                _mux_shifted(packet, output(clip, m), index, start)
        finally:
            for out, _ in outputs.values():
                out.close()
    for clip, row in enumerate(results):
        for m, item in enumerate(row):
            if item is not None:
                row[m] = (item[0], counts[clip][m])
    return results


def _mux_shifted(
    packet: av.Packet,  # type: ignore[type-arg]
    target: tuple[OutputContainer, dict[int, av.stream.Stream]],
    index: int,
    offset: int,
) -> None:
    """Mux a copy of `packet` into `target`, its timestamps moved back by `offset` (time
    base units). Pre-roll comes out negative: the MP4 muxer writes an edit list for it."""
    out, mapping = target
    copy = av.Packet(bytes(packet))
    copy.pts = packet.pts - offset if packet.pts is not None else None
    copy.dts = packet.dts - offset if packet.dts is not None else None
    copy.duration = packet.duration
    copy.time_base = packet.time_base
    copy.is_keyframe = packet.is_keyframe
    copy.stream = mapping[index]
    out.mux(copy)


def remux_clips(path: Path, stream_index: int, cuts_s: list[float]) -> list[tuple[bytes, int]]:
    """Cut one stream into standalone MP4 clips in a single demux pass, without re-encoding.

    `cuts_s` are ascending boundaries (seconds from the stream's first pts): clip i holds the
    frames with cuts_s[i] <= pts < cuts_s[i+1] (the packet runs of `services.media.cutting`).
    Timestamps are rebased to each clip's start. Returns (mp4 bytes, packet count) per clip.
    """
    import tempfile

    if len(cuts_s) < 2:
        raise RemuxError("need at least two cut points")
    index = packet_indexes(path)[stream_index]
    with av.open(str(path)) as source:
        tb = source.streams[stream_index].time_base
    if tb is None:
        raise RemuxError("stream has no time base")
    pts = index["pts"]
    origin = int(pts[pts != np.iinfo(np.int64).min].min())
    bounds = [origin + ticks(c, tb) for c in cuts_s]
    bounds[-1] = max(bounds[-1], int(pts.max()) + 1)
    windows = list(itertools.pairwise(bounds))
    runs = plan_runs(pts, index["keyframe"], windows)
    if any(r is None for r in runs):
        raise RemuxError(f"empty clip at index {runs.index(None)}")
    plan = MemberPlan(stream_index, "mp4", runs, [w[0] for w in windows])
    with tempfile.TemporaryDirectory(prefix="egoline-remux-") as tmp:
        rows = remux_members(path, [plan], len(windows), Path(tmp), "clip")
        out = []
        for row in rows:
            item = row[0]
            if item is None:
                raise RemuxError("empty clip")
            out.append((item[0].read_bytes(), item[1]))
    return out


def ticks(seconds: float, tb: Fraction) -> int:
    """Seconds -> the first tick at or after them (a hair of float slack: a keyframe time
    computed from its own pts maps back to that pts)."""
    return math.ceil(seconds / float(tb) - 1e-6)


@dataclass(frozen=True)
class DecodedFrames:
    """What a full decode of one stream gave: frame timestamps in seconds (after edit lists)."""

    times_s: list[float]
    errors: int


def decode_stream_times(source: Path | bytes, stream_index: int) -> DecodedFrames:
    """Fully decode one stream (file or in-memory container) and list its frame times. Decoder
    errors are counted, not raised: the count of frames that came out is the measure."""
    times: list[float] = []
    errors = 0
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    with av.open(handle, mode="r") as container:
        stream = container.streams[stream_index]
        tb = stream.time_base
        for packet in container.demux(stream):
            try:
                for frame in packet.decode():
                    if (
                        isinstance(frame, av.VideoFrame | av.AudioFrame)
                        and frame.pts is not None
                        and tb is not None
                    ):
                        times.append(float(frame.pts * tb))
            except av.error.FFmpegError:
                errors += 1
    return DecodedFrames(times, errors)


def stream_layout(source: Path | bytes) -> list[tuple[int, str, str]]:
    """(index, kind, codec) of every stream of a container, for counting what reached a clip.
    Raises ProbeError when it is not a container."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else str(source)
    try:
        with av.open(handle) as container:
            return [(s.index, str(s.type), canonical_codec(s)) for s in container.streams]
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise ProbeError(f"cannot open container: {exc}") from exc


def decode_frames(
    data: bytes, max_frames: int | None = None, height: int | None = None
) -> Iterator[NDArray[np.uint8]]:
    """Decode the frames of the first video stream of an in-memory container, as RGB arrays:
    every frame, or the first `max_frames` (decoding stops there; a clip starts on a keyframe,
    so no earlier frame is needed); at the stream's size, or scaled by swscale to `height`
    rows with the aspect ratio kept (width rounded to even), as a training input pipeline
    does before cropping: a 720p RGB frame is 2.6 MiB, at 224 rows 0.26 MiB."""
    if max_frames is not None and max_frames < 0:
        raise ValueError("max_frames must be >= 0")
    if height is not None and height < 2:
        raise ValueError("height must be >= 2")
    if max_frames == 0:
        return
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        width: int | None = None
        if height is not None and stream.width and stream.height:
            width = max(2, round(stream.width * height / stream.height / 2) * 2)
        for count, frame in enumerate(container.decode(stream), start=1):
            if width is None:
                rgb = frame.to_ndarray(format="rgb24")
            else:
                rgb = frame.to_ndarray(format="rgb24", width=width, height=height)
            yield cast(NDArray[np.uint8], rgb)
            if count == max_frames:
                return


def corrupt_keyframes(source: Path, dest: Path, seed: int, every: int = 2) -> int:
    """Copy `source` to `dest`, replacing the payload of every `every`-th keyframe after the
    first with random bytes of the same length: the container stays intact (demux works) while
    decoding those keyframes fails. Returns the number of corrupted packets."""
    rng = np.random.default_rng(seed)
    corrupted = 0
    keyframe_no = 0
    with (
        av.open(str(source)) as src,
        av.open(str(dest), mode="w", format=src.format.name.split(",")[0]) as out,
    ):
        in_stream = src.streams.video[0]
        out_stream = out.add_stream_from_template(in_stream)
        for packet in src.demux(in_stream):
            if packet.size == 0:
                continue
            if packet.is_keyframe:
                keyframe_no += 1
                if keyframe_no > 1 and keyframe_no % every == 0:
                    noise = rng.integers(0, 256, packet.size, dtype=np.uint8).tobytes()
                    replacement = av.Packet(noise)
                    replacement.pts, replacement.dts = packet.pts, packet.dts
                    replacement.time_base = packet.time_base
                    replacement.is_keyframe = True
                    replacement.stream = out_stream
                    out.mux(replacement)
                    corrupted += 1
                    continue
            packet.stream = out_stream
            out.mux(packet)
    return corrupted


def remux_prefix(source: Path, dest: Path, duration_s: float, title: str) -> int:
    """Copy the first `duration_s` seconds of every stream into `dest` (same container kind),
    without re-encoding, with `title` in the container metadata; returns packets written.
    Cutting at a keyframe boundary of the primary stream keeps the result decodable."""
    written = 0
    with av.open(str(source)) as src:
        fmt = str(src.format.name).split(",")[0]
        fmt = "mp4" if fmt == "mov" else fmt
        with av.open(str(dest), mode="w", format=fmt, options={"fflags": "+bitexact"}) as out:
            out.metadata["title"] = title
            mapping = {s.index: out.add_stream_from_template(s) for s in src.streams.video}
            for packet in src.demux(*src.streams.video):
                if packet.pts is None or packet.size == 0 or packet.time_base is None:
                    continue
                if float(packet.pts * packet.time_base) >= duration_s:
                    continue
                packet.stream = mapping[packet.stream.index]
                out.mux(packet)
                written += 1
    return written


def transcode_full(source: Path, dest: Path, crf: int = 23, preset: str = "medium") -> int:
    """Decode every frame of the first video stream and re-encode it with libx264 (the obvious
    approach the benchmarks compare against). Returns frames encoded."""
    frames = 0
    with av.open(str(source)) as src, av.open(str(dest), mode="w", format="mp4") as out:
        in_stream = src.streams.video[0]
        rate = in_stream.average_rate or Fraction(30, 1)
        stream = out.add_stream("libx264", rate=rate)
        stream.width = int(in_stream.codec_context.width)
        stream.height = int(in_stream.codec_context.height)
        stream.pix_fmt = "yuv420p"
        stream.codec_context.options = {"preset": preset, "crf": str(crf)}
        for frame in src.decode(in_stream):
            frame.pts = frames  # time_base 1/rate: one tick a frame
            frame.time_base = Fraction(1, 1) / Fraction(rate)
            out.mux(stream.encode(frame))
            frames += 1
        out.mux(stream.encode(None))
    return frames


def _pix_fmt(stream: av.stream.Stream) -> str | None:
    if not isinstance(stream, VideoStream):
        return None
    fmt = stream.codec_context.pix_fmt
    return str(fmt) if fmt else None


@dataclass
class DeviceVideo:
    """One video stream as a device's encoder writes it: encoder defaults unless `options`
    says otherwise. `frames` yields HxWx3 uint8 RGB (or HxW uint16 for `gray16le`); `pts` are
    the frames' timestamps in `time_base` units (irregular for variable frame rate)."""

    encoder: str  # libx264, libx265, libsvtav1, ffv1
    frames: Iterable[NDArray[np.generic]]
    pts: list[int]
    time_base: Fraction
    rate: int
    width: int
    height: int
    pix_fmt: str = "yuv420p"
    options: dict[str, str] = field(default_factory=dict)
    title: str | None = None
    rotation_deg: int = 0


def encode_device_file(
    path: Path,
    videos: list[DeviceVideo],
    container_format: str,
    audio_s: float = 0.0,
    container_options: dict[str, str] | None = None,
) -> None:
    """Write a recording the way a device does: each stream through its encoder with its
    defaults, interleaved by time, plus (when `audio_s` > 0) a 48 kHz AAC tone of that length."""
    with av.open(
        str(path), mode="w", format=container_format, options=container_options or {}
    ) as out:
        encoders: list[tuple[VideoStream, DeviceVideo, Iterator[NDArray[np.generic]]]] = []
        for spec in videos:
            stream = cast(VideoStream, out.add_stream(spec.encoder, rate=spec.rate))
            stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, spec.pix_fmt
            stream.time_base = spec.time_base
            stream.codec_context.time_base = spec.time_base
            if spec.options:
                stream.codec_context.options = spec.options
            if spec.title:
                stream.metadata["title"] = spec.title
            if spec.rotation_deg:
                stream.set_display_rotation(spec.rotation_deg)
            encoders.append((stream, spec, iter(spec.frames)))
        audio = None
        if audio_s > 0:
            audio = out.add_stream("aac", rate=48_000)
        samples = int(audio_s * 48_000)
        tone = (0.2 * np.sin(2 * np.pi * 440 * np.arange(samples) / 48_000)).astype(np.float32)
        audio_at = 0
        for number in itertools.count():
            alive = False
            for stream, spec, frames in encoders:
                if number >= len(spec.pts):
                    continue
                array = next(frames, None)
                if array is None:
                    continue
                alive = True
                if spec.pix_fmt == "gray16le":
                    frame = av.VideoFrame.from_ndarray(
                        cast(NDArray[np.uint16], array), format="gray16le"
                    )
                else:
                    rgb = av.VideoFrame.from_ndarray(cast(NDArray[np.uint8], array), format="rgb24")
                    frame = rgb.reformat(format=spec.pix_fmt)
                frame.pts = spec.pts[number]
                frame.time_base = spec.time_base
                out.mux(stream.encode(frame))
            if audio is not None and videos and number < len(videos[0].pts):
                # Interleaved by time: the audio up to this video frame's time.
                now = float(videos[0].pts[number] * videos[0].time_base)
                while audio_at + 1024 <= samples and audio_at / 48_000 <= now:
                    _mux_tone(out, audio, tone, audio_at)
                    audio_at += 1024
            if not alive:
                break
        for stream, _, _ in encoders:
            out.mux(stream.encode(None))
        if audio is not None:
            while audio_at + 1024 <= samples:
                _mux_tone(out, audio, tone, audio_at)
                audio_at += 1024
            out.mux(audio.encode(None))


def _mux_tone(
    out: OutputContainer,
    audio: av.audio.stream.AudioStream,
    tone: NDArray[np.float32],
    start: int,
) -> None:
    chunk = np.ascontiguousarray(tone[start : start + 1024].reshape(1, -1))
    sound = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
    sound.sample_rate = 48_000
    sound.pts = start
    sound.time_base = Fraction(1, 48_000)
    out.mux(audio.encode(sound))


# --- inspection of test media (what a fixture really holds) ------------------------------


class InspectError(ValueError):
    """The file cannot be opened as a media container."""


@dataclass(frozen=True)
class PacketInfo:
    """One demuxed packet: times in seconds (None where the container stores none, e.g. a
    Matroska B-frame's dts), the keyframe flag, and for HEVC the NAL unit types it carries."""

    pts_s: float | None
    dts_s: float | None
    keyframe: bool
    size_bytes: int
    nal_types: tuple[int, ...] = ()


@dataclass(frozen=True)
class InspectedStream:
    """One stream as demuxed: the codec's own name ("h264", "hevc", "av1", "ffv1", "aac",
    "opus"; never the decoder's, e.g. libdav1d), pix_fmt (video), `title` metadata, rotation of
    the first decoded frame in degrees counter-clockwise (its display matrix; 0 without one),
    the stream time base (seconds per tick) and every packet in decode order."""

    index: int
    kind: str
    codec: str
    pix_fmt: str | None
    title: str | None
    rotation_deg: int
    start_time_s: float | None
    time_base: Fraction
    packets: tuple[PacketInfo, ...] = field(repr=False)


@dataclass(frozen=True)
class MediaInfo:
    """Every stream of a file. `demux_order` is the stream index of each packet in file order
    (to see interleaving); `complete` is False if demuxing stopped on a damaged tail."""

    format_name: str
    streams: tuple[InspectedStream, ...]
    demux_order: tuple[int, ...] = field(repr=False)
    complete: bool

    def video(self) -> list[InspectedStream]:
        return [s for s in self.streams if s.kind == "video"]

    def audio(self) -> list[InspectedStream]:
        return [s for s in self.streams if s.kind == "audio"]


def inspect_media(path: Path) -> MediaInfo:
    """Demux every packet of `path` (small test files only: all packets are kept) and decode the
    first frame of each video stream for its rotation. A damaged tail (a file cut mid-write)
    ends the demux early with `complete=False`. Raises InspectError if the file does not open."""
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as exc:
        raise InspectError(f"{path.name}: {exc}") from exc
    with container:
        wanted = [s for s in container.streams if s.type in ("video", "audio")]
        packets: dict[int, list[PacketInfo]] = {s.index: [] for s in wanted}
        rotation: dict[int, int | None] = {s.index: None for s in wanted if s.type == "video"}
        order: list[int] = []
        complete = True
        try:
            for packet in container.demux(wanted):
                if packet.size == 0:
                    continue  # the flush packet at the end of each stream
                stream = packet.stream
                time_base = stream.time_base or Fraction(1)
                is_hevc = stream.codec_context.codec.canonical_name == "hevc"
                order.append(stream.index)
                packets[stream.index].append(
                    PacketInfo(
                        pts_s=None if packet.pts is None else float(packet.pts * time_base),
                        dts_s=None if packet.dts is None else float(packet.dts * time_base),
                        keyframe=packet.is_keyframe,
                        size_bytes=packet.size,
                        nal_types=hevc_nal_types(bytes(packet)) if is_hevc else (),
                    )
                )
                if rotation.get(stream.index, 0) is None:
                    for frame in packet.decode():
                        if isinstance(frame, av.VideoFrame):
                            rotation[stream.index] = frame.rotation
                            break
        except (av.error.FFmpegError, EOFError):
            complete = False
        streams = tuple(
            InspectedStream(
                index=s.index,
                kind=s.type,
                codec=s.codec_context.codec.canonical_name,
                pix_fmt=s.codec_context.pix_fmt if isinstance(s, VideoStream) else None,
                title=s.metadata.get("title"),
                rotation_deg=rotation.get(s.index) or 0,
                start_time_s=None
                if s.start_time is None or s.time_base is None
                else float(s.start_time * s.time_base),
                time_base=s.time_base or Fraction(1),
                packets=tuple(packets[s.index]),
            )
            for s in wanted
        )
        return MediaInfo(container.format.name, streams, tuple(order), complete)


def decode_first_frame(path: Path, stream_index: int) -> NDArray[np.uint8] | NDArray[np.uint16]:
    """The first frame of video stream `stream_index` as an array in its own pixel format:
    HxW uint16 for gray16le (e.g. FFV1 depth, millimetres), HxWx3 uint8 RGB otherwise.
    Raises InspectError if the file does not open or the stream yields no frame."""
    try:
        with av.open(str(path)) as container:
            stream = container.streams[stream_index]
            for frame in container.decode(stream):
                if not isinstance(frame, av.VideoFrame):
                    break
                if frame.format.name == "gray16le":
                    return np.asarray(frame.to_ndarray(), dtype=np.uint16)
                return np.asarray(frame.to_ndarray(format="rgb24"), dtype=np.uint8)
    except (av.error.FFmpegError, OSError, IndexError) as exc:
        raise InspectError(f"{path.name}: stream {stream_index}: {exc}") from exc
    raise InspectError(f"{path.name}: stream {stream_index} has no video frame")


def hevc_nal_types(data: bytes, length_size: int = 4) -> tuple[int, ...]:
    """NAL unit types in one length-prefixed HEVC packet (MP4 `hvcC` / Matroska layout, 4-byte
    lengths as x265 writes). 19/20 are IDR, 21 CRA (open GOP), 8/9 RASL leading pictures."""
    return tuple(_nal_headers(data, length_size))


def _nal_headers(data: bytes, length_size: int) -> Iterator[int]:
    offset = 0
    while offset + length_size < len(data):
        length = int.from_bytes(data[offset : offset + length_size], "big")
        yield (data[offset + length_size] >> 1) & 0x3F
        offset += length_size + length
