"""Every use of PyAV in egoline lives here ("PyAV in one place").

Time units: PyAV packet `pts`/`dts` are integers in the stream's `time_base` (a Fraction of a
second); everything this module returns is in seconds (float) unless a name says otherwise.
"""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import av.error
import numpy as np
from av.container import OutputContainer
from av.video.stream import VideoStream
from numpy.typing import NDArray

logging.getLogger("libav").setLevel(logging.CRITICAL)
av.logging.set_level(av.logging.PANIC)


class ProbeError(ValueError):
    """The file cannot be opened or demuxed as a video container."""


class RemuxError(RuntimeError):
    """A clip could not be cut out of its episode."""


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


@dataclass
class StreamProbe:
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


@dataclass
class ContainerProbe:
    format_name: str
    duration_s: float
    complete: bool
    streams: list[StreamProbe] = field(default_factory=list)
    error: str | None = None


def _seconds(value: int | None, time_base: Fraction | None) -> float:
    if value is None or time_base is None:
        return 0.0
    return float(value * time_base)


# The probe keeps ~100 bytes per packet: this bounds its memory at a few hundred MB whatever
# the file claims (18.5 h of 30 fps video; a file of millions of tiny packets is hostile).
MAX_PACKETS = 2_000_000


def probe_container(path: Path, max_packets: int = MAX_PACKETS) -> ContainerProbe:
    """Demux every packet (no decoding) and index each video stream's GOPs and timestamps.

    Raises ProbeError when the file is not a readable video container at all, or holds more
    than `max_packets` video packets.
    """
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise ProbeError(f"cannot open container: {exc}") from exc
    with container:
        videos = list(container.streams.video)
        if not videos:
            raise ProbeError("no video stream")
        header_duration = (container.duration or 0) / 1_000_000  # AV_TIME_BASE is microseconds
        state = {s.index: _PacketLog() for s in videos}
        error: str | None = None
        count = 0
        try:
            for packet in container.demux(videos):
                if packet.size == 0:  # flush packet at end of stream
                    continue
                count += 1
                if count > max_packets:
                    raise ProbeError(f"more than {max_packets} video packets")
                entry = state[packet.stream.index]
                entry.dts.append(packet.dts)
                entry.pts.append(packet.pts)
                entry.durations.append(packet.duration or 0)
                entry.positions.append(packet.pos if packet.pos is not None else -1)
                entry.sizes.append(packet.size)
                entry.key_flags.append(bool(packet.is_keyframe))
                if packet.is_keyframe:
                    entry.keyframes.append(packet.pts)
                if packet.is_corrupt:
                    entry.corrupt += 1
        except av.error.FFmpegError as exc:
            error = f"demux stopped early: {exc}"
        streams = [_stream_probe(s, state[s.index]) for s in videos]
    primary = streams[0]
    duration = header_duration or primary.duration_s
    # Complete: demux reached the end cleanly and the packets cover the duration the header
    # announces (a truncated MKV/WebM keeps its header but loses its tail).
    covers = primary.duration_s >= duration - max(0.5, 2.0 / max(primary.fps, 1.0))
    return ContainerProbe(
        format_name=str(container.format.name),
        duration_s=duration,
        complete=error is None and covers,
        streams=streams,
        error=error,
    )


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
    corrupt: int = 0


PACKET_INDEX_DTYPE = np.dtype(
    [("pts", "<i8"), ("dts", "<i8"), ("pos", "<i8"), ("size", "<i4"), ("keyframe", "?")]
)


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


def _stream_probe(stream: VideoStream, entry: _PacketLog) -> StreamProbe:
    tb = stream.time_base
    dts = [d for d in entry.dts if d is not None]
    pts = sorted(p for p in entry.pts if p is not None)
    non_monotonic = sum(1 for a, b in itertools.pairwise(dts) if b <= a)
    gaps = [_seconds(b - a, tb) for a, b in itertools.pairwise(pts)]
    last_dur = entry.durations[-1] if entry.durations else 0
    duration = _seconds(pts[-1] - pts[0] + last_dur, tb) if pts else 0.0
    rate = stream.average_rate or stream.guessed_rate
    ctx = stream.codec_context
    rotation = 0
    try:
        rotation = int(stream.metadata.get("rotate", "0"))
    except ValueError:
        rotation = 0
    return StreamProbe(
        index=stream.index,
        codec=str(ctx.name),
        width=int(ctx.width or 0),
        height=int(ctx.height or 0),
        fps=float(rate) if rate else 0.0,
        pix_fmt=str(ctx.pix_fmt) if ctx.pix_fmt else None,
        bit_rate=int(ctx.bit_rate) if ctx.bit_rate else None,
        rotation_deg=rotation,
        duration_s=duration,
        frame_count=len(entry.pts),
        keyframe_times_s=sorted(
            _seconds(k - (pts[0] if pts else 0), tb) for k in entry.keyframes if k is not None
        ),
        non_monotonic_count=non_monotonic,
        corrupt_packet_count=entry.corrupt,
        max_gap_s=max(gaps, default=0.0),
        packet_index=packet_table(entry),
    )


@dataclass
class KeyframeCheck:
    decoded: int
    failed: int
    first_error: str | None


def decode_keyframes(path: Path, stream_index: int, full: bool = False) -> KeyframeCheck:
    """Decode only the keyframes of one stream (or every frame when `full`).

    Returns how many frames came out and how many packets the decoder refused.
    """
    decoded = failed = 0
    first_error: str | None = None
    with av.open(str(path)) as container:
        stream = cast(VideoStream, container.streams[stream_index])
        if not full:
            stream.codec_context.skip_frame = "NONKEY"
            # The deblocking filter only smooths reconstructed pixels; skipping it saves ~25% of
            # keyframe decode time and still catches every bitstream error.
            stream.codec_context.options = {"skip_loop_filter": "all"}
        for packet in container.demux(stream):
            if packet.size == 0:
                continue
            # Every packet goes to the decoder: with skip_frame=NONKEY it only parses the
            # non-key ones (cheap), which still catches garbage where a keyframe flag was lost.
            try:
                frames = packet.decode()
                decoded += len(frames)
                if packet.is_corrupt:
                    raise av.error.InvalidDataError(0, "corrupt packet flag")
            except av.error.FFmpegError as exc:
                failed += 1
                first_error = first_error or str(exc)
        try:
            decoded += len(stream.decode(None))  # drain frames the decoder still holds
        except av.error.FFmpegError as exc:
            failed += 1
            first_error = first_error or str(exc)
    return KeyframeCheck(decoded=decoded, failed=failed, first_error=first_error)


def remux_clips(path: Path, stream_index: int, cuts_s: list[float]) -> list[tuple[bytes, int]]:
    """Cut one stream into standalone MP4 clips in a single demux pass, without re-encoding.

    `cuts_s` are ascending boundaries (seconds from the stream's first pts): clip i holds the
    packets with cuts_s[i] <= pts < cuts_s[i+1]. Each boundary but the last must be a keyframe
    time, so every clip decodes on its own. Timestamps are rebased to start at 0. Returns
    (mp4 bytes, packet count) per clip.
    """
    if len(cuts_s) < 2:
        raise RemuxError("need at least two cut points")
    import bisect

    buffers = [io.BytesIO() for _ in cuts_s[:-1]]
    counts = [0] * len(buffers)
    with av.open(str(path)) as source:
        in_stream = source.streams[stream_index]
        tb = in_stream.time_base
        if tb is None:
            raise RemuxError("stream has no time base")
        outputs: dict[int, tuple[OutputContainer, VideoStream, int]] = {}
        origin: int | None = None
        try:
            for packet in source.demux(in_stream):
                if packet.pts is None or packet.size == 0:
                    continue
                if origin is None:
                    origin = packet.pts
                t = _seconds(packet.pts - origin, tb) + 1e-6
                clip = bisect.bisect_right(cuts_s, t) - 1
                if clip < 0 or clip >= len(buffers):
                    continue
                if clip not in outputs:
                    if not packet.is_keyframe:
                        raise RemuxError(f"clip {clip} start {cuts_s[clip]:.3f}s is not a keyframe")
                    out = av.open(buffers[clip], mode="w", format="mp4")
                    out_stream = cast(VideoStream, out.add_stream_from_template(in_stream))
                    base = packet.dts if packet.dts is not None else packet.pts
                    outputs[clip] = (out, out_stream, base)
                out, out_stream, base = outputs[clip]
                packet.pts -= base
                if packet.dts is not None:
                    packet.dts -= base
                packet.stream = out_stream
                out.mux(packet)
                counts[clip] += 1
        finally:
            for out, _, _ in outputs.values():
                out.close()
    if 0 in counts:
        raise RemuxError(f"empty clip at index {counts.index(0)}")
    return [(b.getvalue(), c) for b, c in zip(buffers, counts, strict=True)]


def decode_frames(data: bytes) -> Iterator[NDArray[np.uint8]]:
    """Decode every frame of the first video stream of an in-memory container, as RGB arrays."""
    with av.open(io.BytesIO(data), mode="r") as container:
        for frame in container.decode(video=0):
            yield cast(NDArray[np.uint8], frame.to_ndarray(format="rgb24"))


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
