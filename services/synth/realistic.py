"""Episodes made the way devices and encoders make them by default (`egoline synth --realistic`).

Every case keeps the encoder's own GOP decisions (x264/x265/SVT-AV1 defaults: keyint 250, scene
cuts, B-frames, x265's open GOP), and the scene changes at irregular times so encoders insert
scene-cut keyframes. Cases cover what the issue tracker saw break: open-GOP HEVC, AV1, 10-bit,
variable and high frame rate, audio, rotation, RGB + 16-bit depth in one MKV, several camera
files, fragmented MP4, files cut mid-write, byte-chunked recordings, IMU at its own rate (npy with
timestamps, CSV with a header, 100 Hz to 1 kHz) and the legacy frame-synced IMU. Small frames
(320x240) keep each case to a few seconds of encoding; the durations are long enough (>= 12 s at
30 fps) for a keyint-250 keyframe to appear.

`curation_cases` is a labelled mix for curation (issue 17): mostly clean episodes plus content
defects (blur, over/under-exposure, a frozen camera, a covered lens, a device left on a table)
and duplicates (re-encoded, trimmed by stream copy). The ground truth goes in `labels.json`
beside `episode.json`; episode.json does not name it, so the agent never uploads it, and no
label leaks into episode.json (curation case names are neutral: `curation_0007`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np
from numpy.typing import NDArray

from services.agent.recordings import COMPLETION_MARKER
from services.media.av_io import (
    DeviceVideo,
    decode_frames,
    encode_device_file,
    packet_indexes,
    remux_clips,
    time_bases,
)
from services.media.cutting import MISSING, entry_points
from services.synth import scene

WIDTH, HEIGHT = 320, 240
X265 = {"x265-params": "log-level=error"}
SVT = {"preset": "12"}
LABELS_FILE = "labels.json"
LABELS_VERSION = 1
DEFECTS = ("blur", "overexposed", "underexposed", "frozen", "covered", "static")
DUPLICATES = ("dup_reencoded", "dup_trimmed")
CONTENTS = ("clean", *DEFECTS, *DUPLICATES)
BLUR_SIGMA_PX = 4.0  # a soft lens / fogged cover: Laplacian variance falls ~1000x
MIN_FROZEN_S = 4.0
MIN_TRIM_S, MIN_LEFT_S = 2.0, 3.0  # dup_trimmed: cut at the first keyframe >= 2 s, keep >= 3 s
OFFSET_STRIDE = 100_003  # seed_offset step between a mix's cases: above any seed used


@dataclass(frozen=True)
class RealisticCase:
    """One device recording. `codec`: h264, h265 or av1 (the main camera).

    `content` is what the picture (and IMU) shows: "clean" or one of `DEFECTS` / `DUPLICATES`.
    A duplicate names its original (`duplicate_of`, an earlier case's name) and is written
    from the original's seed, so both hold the same source frames and IMU. `seed_offset` is
    added to the writer's seed for this case's content and identity (device, start time), so
    the cases of one mix differ. `width`/`height`/`crf` are the main camera's encoded size and
    rate control (None: the encoder's default CRF); only `dup_reencoded` changes them.
    """

    name: str
    codec: str = "h264"
    container: str = "mp4"  # mp4 or mkv
    duration_s: float = 12.0
    fps: int = 30
    ten_bit: bool = False
    closed_gop: bool = False
    vfr: bool = False
    audio: bool = False
    rotation_deg: int = 0
    depth: bool = False
    fragmented: bool = False
    cut_fraction: float | None = None  # keep this fraction of the bytes (power cut)
    chunk_bytes: int | None = None  # write the video as byte-contiguous pieces
    second_camera_offset_s: float | None = None  # a second camera file, started this late
    imu: str = "npy200"  # npy<rate> (N, 7) with timestamps, csv<rate>, frame_synced, none
    expect: str = "accept"
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    content: str = "clean"
    duplicate_of: str | None = None
    seed_offset: int = 0
    width: int = WIDTH
    height: int = HEIGHT
    crf: int | None = None

    def __post_init__(self) -> None:
        if self.content not in CONTENTS:
            raise ValueError(f"{self.name}: content {self.content!r} not in {CONTENTS}")
        if (self.content in DUPLICATES) != (self.duplicate_of is not None):
            raise ValueError(f"{self.name}: a duplicate, and only a duplicate, names its original")
        if self.content == "static" and self.imu == "none":
            raise ValueError(f"{self.name}: static is told by its IMU; it needs one")
        if self.content == "frozen" and self.duration_s < 2 * MIN_FROZEN_S:
            raise ValueError(f"{self.name}: frozen needs >= {2 * MIN_FROZEN_S} s")


def episode_id_of(name: str, seed: int) -> str:
    """The episode id of case `name` written with `seed` (so a label can name another case)."""
    return f"{name.replace('_', '-')}-{seed:04d}"


def realistic_cases() -> list[RealisticCase]:
    """The device-format mix: each case a recording of its own (`seed_offset`: written with
    one seed, cases that shared it held the same picture and IMU, which the warehouse rightly
    took for near duplicates of each other)."""
    cases = [
        RealisticCase("h264_default_mp4", duration_s=16.0, notes="x264 defaults, B-frames"),
        RealisticCase(
            "h265_default_open_gop_mp4",
            codec="h265",
            duration_s=20.0,
            notes="x265 defaults: open GOP, CRA keyframes with leading RASL frames",
        ),
        RealisticCase("h265_10bit_mkv", codec="h265", container="mkv", ten_bit=True, imu="csv100"),
        RealisticCase("h265_closed_gop_mp4", codec="h265", closed_gop=True),
        RealisticCase("av1_default_mp4", codec="av1", imu="npy1000"),
        RealisticCase("av1_10bit_mkv", codec="av1", container="mkv", ten_bit=True),
        RealisticCase("h264_vfr_mp4", vfr=True, notes="phone-style jittered and dropped frames"),
        RealisticCase("h264_120fps_mp4", fps=120, duration_s=6.0, imu="npy1000"),
        RealisticCase("h264_audio_mp4", audio=True),
        RealisticCase("h264_rotated_mp4", rotation_deg=90),
        RealisticCase(
            "rgbd_ffv1_depth_mkv",
            container="mkv",
            depth=True,
            audio=True,
            notes="H.264 RGB + FFV1 gray16le depth + AAC in one MKV",
        ),
        RealisticCase("h264_fragmented_mp4", fragmented=True),
        RealisticCase(
            "h264_fragmented_cut_mp4",
            fragmented=True,
            cut_fraction=0.7,
            expect="accept_with_warnings",
            notes="power cut: 70 % of the bytes",
        ),
        RealisticCase(
            "h264_mkv_cut", container="mkv", cut_fraction=0.7, expect="accept_with_warnings"
        ),
        RealisticCase("h264_chunked_mkv", container="mkv", chunk_bytes=64 * 1024),
        RealisticCase(
            "multicam_mp4",
            second_camera_offset_s=0.2,
            expect="accept_with_warnings",
            notes="head + wrist camera files; the wrist starts 0.2 s late (a skew warning)",
        ),
        RealisticCase("imu_frame_synced_mp4", imu="frame_synced"),
        RealisticCase("imu_100hz_csv_mp4", imu="csv100", audio=True),
    ]
    return [replace(c, seed_offset=(i + 1) * OFFSET_STRIDE) for i, c in enumerate(cases)]


def _scene_cuts(frames: int, seed: int) -> set[int]:
    """Irregular scene-change frames (so encoders insert scene-cut keyframes off any grid), 3-13 s
    apart: with a detailed scene every cut is detected, and gaps past keyint 250 keep the
    keyint-triggered keyframes (x265's open-GOP CRAs with leading pictures) in the mix. The
    first gap is always one of those (the first cut at frame 260-399), so every recording of
    more than 250 frames has one, whatever its seed."""
    rng = np.random.default_rng(seed + 5)
    cuts: set[int] = set()
    at = int(rng.integers(260, 400))
    while at < frames:
        cuts.add(at)
        at += int(rng.integers(90, 400))
    return cuts


@dataclass(frozen=True)
class ContentSpans:
    """Frame-index spans [first, end) of a case's defect, if it has one."""

    frozen: tuple[int, int] | None = None
    covered: tuple[int, int] | None = None


def content_spans(case: RealisticCase, frames: int, seed: int) -> ContentSpans:
    """Where a frozen or covered case's defect sits: frozen for 4-6 s starting >= 1.5 s in (the
    rest moves); covered from 0.5-1.5 s in to 0-1 s before the end (most of the recording)."""
    rng = np.random.default_rng(seed + 31)
    if case.content == "frozen":
        length = rng.uniform(MIN_FROZEN_S, min(6.0, case.duration_s - 3.5))
        start = rng.uniform(1.5, case.duration_s - length - 1.5)
        first = round(start * case.fps)
        return ContentSpans(frozen=(first, min(frames, first + round(length * case.fps))))
    if case.content == "covered":
        first = round(rng.uniform(0.5, 1.5) * case.fps)
        end = frames - round(rng.uniform(0.0, 1.0) * case.fps)
        return ContentSpans(covered=(first, end))
    return ContentSpans()


def _sensor_noise(
    rng: np.random.Generator, base: NDArray[np.generic], sigma: float
) -> NDArray[np.uint8]:
    noisy = base.astype(np.float32) + rng.normal(0.0, sigma, base.shape).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def _expose(content: str, frame: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """The whole-recording picture defects, applied to the clean frame."""
    if content == "blur":
        return np.asarray(cv2.GaussianBlur(frame, (0, 0), BLUR_SIGMA_PX), dtype=np.uint8)
    gain, offset = {"overexposed": (2.4, 40.0), "underexposed": (0.15, -9.0)}.get(content, (1, 0))
    if gain == 1:
        return frame
    # over: everything above ~90 clips at 255; under: shadows below ~60 crush to 0
    return np.asarray(np.clip(frame.astype(np.float32) * gain + offset, 0, 255), dtype=np.uint8)


def _rgb(case: RealisticCase, frames: int, seed: int) -> Iterator[NDArray[np.uint8]]:
    """The main camera's frames: a detailed panning scene, inverted at each scene cut, with
    the case's content defect applied."""
    spans = content_spans(case, frames, seed)
    noise = np.random.default_rng(seed + 37)
    if case.content == "static":
        # On a table: one view (no pan, no object, no scene cut); only sensor noise and a slow
        # +-2.5 level drift of the light (auto-exposure hunting) change, so it barely moves.
        (still,) = scene.panning_frames(1, case.width, case.height, seed)
        base = still.astype(np.float32)
        for i in range(frames):
            drift = 2.5 * np.sin(2 * np.pi * i / (4.0 * case.fps))
            yield _sensor_noise(noise, base + drift, 2.0)
        return
    cuts = _scene_cuts(frames, seed)
    flipped = False
    held: NDArray[np.uint8] | None = None
    dark = np.full((case.height, case.width, 3), 6, dtype=np.uint8)
    for i, frame in enumerate(scene.panning_frames(frames, case.width, case.height, seed)):
        if i in cuts:
            flipped = not flipped
        shown = _expose(case.content, (255 - frame) if flipped else frame)
        if spans.frozen and spans.frozen[0] <= i < spans.frozen[1]:
            # A stalled pipeline hands the encoder the same buffer again, byte for byte.
            held = shown if held is None else held
            shown = held
        elif spans.covered and spans.covered[0] <= i < spans.covered[1]:
            shown = _sensor_noise(noise, dark, 1.5)
        yield shown


def _depth(frames: int, width: int, height: int, seed: int) -> Iterator[NDArray[np.uint16]]:
    """16-bit depth in millimetres: the radial scene scaled to 0.3-4 m."""
    for frame in scene.depth_frames(frames, width, height, seed):
        yield (300 + frame[..., 0].astype(np.uint16) * 14).astype(np.uint16)


def _frame_pts(case: RealisticCase, seed: int) -> tuple[list[int], Fraction]:
    frames = round(case.duration_s * case.fps)
    if not case.vfr:
        return list(range(frames)), Fraction(1, case.fps)
    # 90 kHz clock, intervals jittered by up to 4 ms, one frame in 40 dropped.
    rng = np.random.default_rng(seed + 9)
    base = 90_000 / case.fps
    pts, t = [], 0.0
    for i in range(frames):
        if i % 40 == 39:
            t += base
        pts.append(round(t))
        t += base + rng.uniform(-360, 360)
    return pts, Fraction(1, 90_000)


def _encoder(case: RealisticCase) -> tuple[str, str, dict[str, str]]:
    pix = "yuv420p10le" if case.ten_bit else "yuv420p"
    rate = {} if case.crf is None else {"crf": str(case.crf)}
    if case.codec == "h265":
        params = "log-level=error" + (":no-open-gop=1" if case.closed_gop else "")
        return "libx265", pix, {"x265-params": params, **rate}
    if case.codec == "av1":
        return "libsvtav1", pix, {**SVT, **rate}
    return "libx264", pix, rate


def _video(case: RealisticCase, path: Path, seed: int, offset_s: float = 0.0) -> int:
    pts, tb = _frame_pts(case, seed)
    if offset_s:
        shift = round(offset_s / tb)
        pts = [p + shift for p in pts]
    encoder, pix, options = _encoder(case)
    streams = [
        DeviceVideo(
            encoder,
            _rgb(case, len(pts), seed),
            pts,
            tb,
            case.fps,
            case.width,
            case.height,
            pix,
            options,
            title="rgb" if case.depth else None,
            rotation_deg=case.rotation_deg,
        )
    ]
    if case.depth:
        streams.append(
            DeviceVideo(
                "ffv1",
                _depth(len(pts), case.width, case.height, seed),
                pts,
                tb,
                case.fps,
                case.width,
                case.height,
                "gray16le",
                {},
                title="depth",
            )
        )
    fmt = "matroska" if case.container == "mkv" else "mp4"
    options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"} if case.fragmented else {}
    encode_device_file(path, streams, fmt, case.duration_s if case.audio else 0.0, options)
    if case.cut_fraction is not None:
        data = path.read_bytes()
        path.write_bytes(data[: int(len(data) * case.cut_fraction)])
    return len(pts)


def imu_samples(
    rate_hz: float, start_s: float, end_s: float, seed: int, at_rest: bool = False
) -> NDArray[np.float64]:
    """(N, 7) `[t, ax, ay, az, gx, gy, gz]` at the sensor's own rate with clock jitter; m/s^2
    and rad/s. Hand-held: slow sway around gravity on z and head turns (`scene.hand_held_gyro`:
    each seed moves its own way). `at_rest` (on a table): gravity, a slight tilt and a bias,
    plus MEMS noise only (gyro sigma 0.002 rad/s, accel 0.015 m/s^2)."""
    rng = np.random.default_rng(seed + 11)
    count = int((end_s - start_s) * rate_hz)
    t = start_s + np.arange(count) / rate_hz + rng.normal(0, 0.05 / rate_hz, count)
    t.sort()
    if at_rest:
        still = np.array([0.15, -0.10, 9.808, 0.0008, -0.0005, 0.0003])
        noise = rng.normal(0, 1, (count, 6)) * np.array([0.015] * 3 + [0.002] * 3)
        return np.column_stack([t, still + noise])
    accel = np.stack([0.3 * np.sin(1.1 * t), 0.2 * np.cos(0.7 * t), 9.81 + 0.1 * np.sin(2.3 * t)])
    gyro = scene.hand_held_gyro(t, seed).T
    values = np.concatenate([accel, gyro]).T + rng.normal(0, 0.01, (count, 6))
    return np.column_stack([t, values])


def _write_imu(
    case: RealisticCase, directory: Path, frames: int, seed: int, trim_s: float = 0.0
) -> str | None:
    """Write the case's IMU file; `trim_s` drops what the sensor saw before that time and
    rebases the timestamps so t = 0 is the (trimmed) video's first frame, as in every episode."""
    if case.imu == "none":
        return None
    at_rest = case.content == "static"
    if case.imu == "frame_synced":
        rows = scene.imu_rows(frames, case.fps, seed)
        if at_rest:
            rest = imu_samples(case.fps, 0.0, frames / case.fps, seed, True)[:frames, 1:]
            rows = rest.astype(np.float32)
        np.save(directory / "imu.npy", rows[round(trim_s * case.fps) :], allow_pickle=False)
        return "imu.npy"
    rate = float(case.imu[3:])  # npy200 -> 200.0, csv100 -> 100.0
    # The sensor starts a little before the camera and stops a little after.
    samples = imu_samples(rate, -0.05, case.duration_s + 0.05, seed, at_rest)
    if trim_s:
        samples = samples[samples[:, 0] >= trim_s - 0.05]
        samples[:, 0] -= trim_s
    if case.imu.startswith("csv"):
        lines = ["t,ax,ay,az,gx,gy,gz"]
        lines += [",".join(f"{v:.6f}" for v in row) for row in samples]
        (directory / "imu.csv").write_text("\n".join(lines) + "\n")
        return "imu.csv"
    np.save(directory / "imu.npy", samples, allow_pickle=False)
    return "imu.npy"


def _chunk(path: Path, size: int) -> None:
    data = path.read_bytes()
    for n, start in enumerate(range(0, len(data), size)):
        (path.parent / f"{path.name}.{n:03d}").write_bytes(data[start : start + size])
    path.unlink()


def _check_duplicable(case: RealisticCase, original: RealisticCase | None) -> RealisticCase:
    """The original a duplicate is made from; raises ValueError unless it is a plain recording
    (clean, one camera stream, no audio, whole file) of the named case."""
    if original is None or original.name != case.duplicate_of:
        raise ValueError(f"{case.name}: write it with its original {case.duplicate_of!r}")
    plain = (
        original.content == "clean"
        and not (original.depth or original.audio or original.fragmented or original.rotation_deg)
        and original.second_camera_offset_s is None
        and original.cut_fraction is None
        and original.chunk_bytes is None
    )
    if not plain:
        raise ValueError(f"{case.name}: {original.name} is not a plain one-stream recording")
    if case.content == "dup_trimmed" and original.container != "mp4":
        raise ValueError(f"{case.name}: the trimmed copy is an MP4 stream copy of an MP4")
    return original


def _main_file(case: RealisticCase) -> str:
    """The name of a case's main video file in its episode folder."""
    ext = "mkv" if case.container == "mkv" else "mp4"
    return f"head.{ext}" if case.second_camera_offset_s is not None else f"video.{ext}"


@contextmanager
def _original_recording(original: RealisticCase, out_dir: Path, seed: int) -> Iterator[Path]:
    """The original's video file a duplicate is made from, as a copy is made: the one written in
    `out_dir` when it is there (a stream copy of it is then the same bytes, and a re-export
    decodes the same frames), else the same recording encoded again into a temporary file
    (when only the duplicate was asked for). Encoding twice is not always bit-identical: x264
    with threads gave different P-frames for the same input once, so a trimmed copy of a second
    encode need not match the first one's frames."""
    directory = out_dir / episode_id_of(original.name, seed)
    if (directory / COMPLETION_MARKER).exists():
        yield directory / _main_file(original)
        return
    with tempfile.TemporaryDirectory(prefix="egoline-dup-") as tmp:
        source = Path(tmp) / f"source{Path(_main_file(original)).suffix}"
        _video(original, source, seed + original.seed_offset)
        yield source


def _reencode(
    case: RealisticCase, original: RealisticCase, source: Path, path: Path, seed: int
) -> int:
    """The original recording (`source`, written with content seed `seed`) decoded, resized to
    `case.width` x `case.height` and encoded again with the case's codec and CRF (a re-export):
    same frames, same times. Returns frames."""
    pts, tb = _frame_pts(original, seed)
    size = (case.width, case.height)
    frames = (
        np.asarray(cv2.resize(f, size, interpolation=cv2.INTER_AREA), dtype=np.uint8)
        for f in decode_frames(source.read_bytes())
    )
    encoder, pix, options = _encoder(case)
    stream = DeviceVideo(encoder, frames, pts, tb, case.fps, *size, pix, options)
    fmt = "matroska" if case.container == "mkv" else "mp4"
    encode_device_file(path, [stream], fmt)
    return len(pts)


def _trim(original: RealisticCase, source: Path, path: Path) -> tuple[int, float]:
    """The original recording (`source`) with its start cut off by stream copy at its first
    keyframe at or after `MIN_TRIM_S` (what `ffmpeg -ss T -c copy` keeps: the packets from that
    keyframe on, timestamps rebased to 0). Returns (frames, seconds cut)."""
    index = packet_indexes(source)[0]
    tb = float(time_bases(source)[0])
    pts = index["pts"]
    origin = int(pts[pts != MISSING].min())
    entries = entry_points(pts, index["keyframe"])
    starts = sorted(float((pts[e] - origin) * tb) for e in entries)
    fits = [t for t in starts if MIN_TRIM_S <= t <= original.duration_s - MIN_LEFT_S]
    if not fits:
        raise ValueError(f"{original.name}: no keyframe in [{MIN_TRIM_S}, end - {MIN_LEFT_S}] s")
    ((data, frames),) = remux_clips(source, 0, [fits[0], original.duration_s + 1.0])
    path.write_bytes(data)
    return frames, fits[0]


def _spans_s(
    span: tuple[int, int] | None, pts: list[int], tb: Fraction, end_s: float
) -> list[list[float]]:
    if span is None:
        return []
    first, end = span
    stop = float(pts[end] * tb) if end < len(pts) else end_s
    return [[round(float(pts[first] * tb), 6), round(stop, 6)]]


def _started_at(
    case: RealisticCase, source: RealisticCase, seed: int, trimmed_s: float
) -> datetime:
    """A recording's start. A copy is announced after its original, as a copy is: a trimmed
    one starts where the kept part of the recording starts, a re-encoded one carries the time
    it was exported again (an hour later), so the original is the earlier of the pair."""
    # within a year of 2026-06-01 whatever the offsets
    start = datetime(2026, 6, 1, tzinfo=UTC) + timedelta(
        minutes=(seed + source.seed_offset) % 500_000
    )
    if case.content == "dup_trimmed":
        return start + timedelta(seconds=trimmed_s)
    if case.content == "dup_reencoded":
        return start + timedelta(hours=1)
    return start


def write_case(
    case: RealisticCase, out_dir: Path, seed: int = 0, original: RealisticCase | None = None
) -> Path:
    """Write one case's episode folder (`labels.json`, then `episode.json` last, atomically);
    returns it. A duplicate needs its `original` case (ValueError otherwise)."""
    episode_id = episode_id_of(case.name, seed)
    directory = out_dir / episode_id
    if (directory / COMPLETION_MARKER).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    main = _main_file(case)
    source = case if case.duplicate_of is None else _check_duplicable(case, original)
    content_seed = seed + source.seed_offset
    own_seed = seed + case.seed_offset
    trimmed_s = 0.0
    if case.content == "dup_reencoded":
        with _original_recording(source, out_dir, seed) as recording:
            frames = _reencode(case, source, recording, directory / main, content_seed)
    elif case.content == "dup_trimmed":
        with _original_recording(source, out_dir, seed) as recording:
            frames, trimmed_s = _trim(source, recording, directory / main)
    else:
        frames = _video(case, directory / main, content_seed)
    meta: dict[str, object] = {
        "episode_id": episode_id,
        "device_id": f"rig{own_seed % 7:02d}",
        "session_id": f"sess-{own_seed:04d}-{case.name[:40].replace('_', '-')}",
        "started_at": _started_at(case, source, seed, trimmed_s).isoformat(),
        "video": main,
        "tags": ["synthetic", "realistic", f"codec={case.codec}", *case.tags],
    }
    if case.second_camera_offset_s is not None:
        wrist = replace(case, name=case.name + "_wrist")
        _video(wrist, directory / "wrist.mp4", content_seed + 1)
        meta["videos"] = {
            "head": main,
            "wrist": {"file": "wrist.mp4", "offset_s": case.second_camera_offset_s},
        }
    imu_frames = frames + round(trimmed_s * source.fps)
    imu = _write_imu(source, directory, imu_frames, content_seed, trimmed_s)
    if imu:
        meta["imu"] = imu
    if case.chunk_bytes:
        _chunk(directory / main, case.chunk_bytes)
    meta["synthetic"] = {
        "case": case.name,
        "expect": case.expect,
        "codec": case.codec,
        "container": case.container,
        "frames": frames,
        "notes": case.notes,
    }
    pts, tb = _frame_pts(case, content_seed)
    spans = content_spans(case, len(pts), content_seed)
    labels = {
        "version": LABELS_VERSION,
        "episode_id": episode_id,
        "content": case.content,
        "duplicate_of": None
        if case.duplicate_of is None
        else episode_id_of(case.duplicate_of, seed),
        "frozen_spans_s": _spans_s(spans.frozen, pts, tb, case.duration_s),
        "covered_spans_s": _spans_s(spans.covered, pts, tb, case.duration_s),
        "trimmed_s": round(trimmed_s, 6) if case.content == "dup_trimmed" else None,
        "imu_clock": "rebased" if case.content == "dup_trimmed" else "video",
    }
    (directory / LABELS_FILE).write_text(json.dumps(labels, indent=2) + "\n")
    tmp = directory / (COMPLETION_MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, directory / COMPLETION_MARKER)
    return directory


def with_originals(
    cases: Iterable[RealisticCase], names: Iterable[str] | None = None
) -> list[tuple[RealisticCase, RealisticCase | None]]:
    """(case, its original or None) for the cases named in `names` (all if None); originals
    are looked up among all `cases` and must come before their duplicates (ValueError)."""
    wanted = None if names is None else set(names)
    seen: dict[str, RealisticCase] = {}
    out: list[tuple[RealisticCase, RealisticCase | None]] = []
    for case in cases:
        original = None
        if case.duplicate_of is not None:
            original = seen.get(case.duplicate_of)
            if original is None:
                raise ValueError(f"{case.name}: original {case.duplicate_of!r} is not before it")
        if wanted is None or case.name in wanted:
            out.append((case, original))
        seen[case.name] = case
    return out


def write_cases(
    cases: Iterable[RealisticCase],
    out_dir: Path,
    seed: int = 0,
    names: Iterable[str] | None = None,
) -> list[Path]:
    return [write_case(c, out_dir, seed, o) for c, o in with_originals(cases, names)]


def write_realistic(out_dir: Path, names: list[str] | None = None, seed: int = 0) -> list[Path]:
    return write_cases(realistic_cases(), out_dir, seed, names or None)


def _clean_case(rng: np.random.Generator, name: str, plain: bool = False) -> RealisticCase:
    """A clean recording of varied make: h264 or h265; some MKV, some RGB-D (multi-stream) or
    with audio; IMU at 200 Hz (npy), 100 Hz (csv), 1 kHz or frame-synced. `plain`: one camera
    stream in MP4 (a recording duplicates are made from)."""
    codec = "h265" if rng.random() < 0.35 else "h264"
    duration = float(np.round(rng.uniform(8.0, 14.0) * 2) / 2)
    imu = str(rng.choice(["npy200", "npy200", "npy200", "csv100", "npy1000", "frame_synced"]))
    make = (
        "plain" if plain else str(rng.choice(["plain", "plain", "plain", "mkv", "rgbd", "audio"]))
    )
    return RealisticCase(
        name,
        codec=codec,
        container="mkv" if make in ("mkv", "rgbd") else "mp4",
        duration_s=max(duration, 12.0) if plain else duration,
        depth=make == "rgbd",
        audio=make in ("rgbd", "audio"),
        imu=imu,
        seed_offset=int(rng.integers(1, 100_000)),
    )


def _plain(case: RealisticCase) -> bool:
    return case.container == "mp4" and not (case.depth or case.audio) and case.duration_s >= 12


def curation_cases(count: int, seed: int = 0) -> list[RealisticCase]:
    """A labelled mix of `count` short (8-14 s) episodes for curation, deterministic by `seed`:
    about 4 % of each content defect and duplicate class (at least one of each when count >=
    16), the rest clean. A duplicate comes after its original, a plain clean recording of >= 12 s
    (`dup_reencoded`: 0.75x or 1.5x the size at CRF +7 or -5; `dup_trimmed`: stream copy from
    the first keyframe >= 2 s). Names are neutral (`curation_0007`): nothing in episode.json
    tells the content; labels.json does. Write them with `write_cases`."""
    if count < 1:
        raise ValueError("count must be >= 1")
    rng = np.random.default_rng(seed + 1717)
    kinds = (*DEFECTS, *DUPLICATES)
    each = max(1, round(count * 0.04))
    flagged = [kinds[i % len(kinds)] for i in range(min(each * len(kinds), count // 2))]
    order = [str(k) for k in rng.permutation(flagged + ["clean"] * (count - len(flagged)))]
    pending = deque(order)
    used: set[str] = set()
    out: list[RealisticCase] = []
    while pending and len(out) < count:
        kind = pending.popleft()
        name = f"curation_{len(out):04d}"
        if kind not in DUPLICATES:
            case = _clean_case(rng, name)
            out.append(case if kind == "clean" else replace(case, content=kind))
            continue
        originals = [c for c in out if c.content == "clean" and _plain(c) and c.name not in used]
        if not originals:
            # No recording to copy yet: record one here, and the duplicate right after.
            out.append(_clean_case(rng, name, plain=True))
            pending.appendleft(kind)
            if "clean" in pending:
                pending.remove("clean")
            continue
        original = originals[int(rng.integers(0, len(originals)))]
        used.add(original.name)
        dup = replace(
            original,
            name=name,
            content=kind,
            duplicate_of=original.name,
            seed_offset=int(rng.integers(1, 100_000)),
        )
        if kind == "dup_reencoded":
            smaller = rng.random() < 0.6
            dup = replace(
                dup,
                width=240 if smaller else 480,
                height=180 if smaller else 360,
                crf=(30 if smaller else 18) + (5 if original.codec == "h265" else 0),
            )
        out.append(dup)
    # Every recording its own content: random offsets collided (two "clean" cases of one mix held
    # the same frames, a true duplicate labelled clean), and so did mixes of nearby seeds. A
    # stride above any seed used keeps both apart; a copy takes its content from its original.
    return [replace(c, seed_offset=(i + 1) * OFFSET_STRIDE) for i, c in enumerate(out)]
