"""Episodes made the way devices and encoders make them by default (`egoline synth --realistic`).

Every case keeps the encoder's own GOP decisions (x264/x265/SVT-AV1 defaults: keyint 250, scene
cuts, B-frames, x265's open GOP), and the scene changes at irregular times so encoders insert
scene-cut keyframes. Cases cover what the issue tracker saw break: open-GOP HEVC, AV1, 10-bit,
variable and high frame rate, audio, rotation, RGB + 16-bit depth in one MKV, several camera
files, fragmented MP4, files cut mid-write, byte-chunked recordings, IMU at its own rate (npy with
timestamps, CSV with a header, 100 Hz to 1 kHz) and the legacy frame-synced IMU. Small frames
(320x240) keep each case to a few seconds of encoding; the durations are long enough (>= 12 s at
30 fps) for a keyint-250 keyframe to appear.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from services.agent.recordings import COMPLETION_MARKER
from services.media.av_io import DeviceVideo, encode_device_file
from services.synth import scene

WIDTH, HEIGHT = 320, 240
X265 = {"x265-params": "log-level=error"}
SVT = {"preset": "12"}


@dataclass(frozen=True)
class RealisticCase:
    """One device recording. `codec`: h264, h265 or av1 (the main camera)."""

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


def realistic_cases() -> list[RealisticCase]:
    return [
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


def _scene_cuts(frames: int, seed: int) -> set[int]:
    """Irregular scene-change frames (so encoders insert scene-cut keyframes off any grid)."""
    rng = np.random.default_rng(seed + 5)
    cuts: set[int] = set()
    at = 0
    while True:
        at += int(rng.integers(90, 260))
        if at >= frames:
            return cuts
        cuts.add(at)


def _rgb(frames: int, seed: int) -> Iterator[NDArray[np.uint8]]:
    cuts = _scene_cuts(frames, seed)
    flipped = False
    for i, frame in enumerate(scene.rgb_frames(frames, WIDTH, HEIGHT, seed)):
        if i in cuts:
            flipped = not flipped
        yield (255 - frame) if flipped else frame


def _depth(frames: int, seed: int) -> Iterator[NDArray[np.uint16]]:
    """16-bit depth in millimetres: the radial scene scaled to 0.3-4 m."""
    for frame in scene.depth_frames(frames, WIDTH, HEIGHT, seed):
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
    if case.codec == "h265":
        params = "log-level=error" + (":no-open-gop=1" if case.closed_gop else "")
        return "libx265", pix, {"x265-params": params}
    if case.codec == "av1":
        return "libsvtav1", pix, dict(SVT)
    return "libx264", pix, {}


def _video(case: RealisticCase, path: Path, seed: int, offset_s: float = 0.0) -> int:
    pts, tb = _frame_pts(case, seed)
    if offset_s:
        shift = round(offset_s / tb)
        pts = [p + shift for p in pts]
    encoder, pix, options = _encoder(case)
    streams = [
        DeviceVideo(
            encoder,
            _rgb(len(pts), seed),
            pts,
            tb,
            case.fps,
            WIDTH,
            HEIGHT,
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
                _depth(len(pts), seed),
                pts,
                tb,
                case.fps,
                WIDTH,
                HEIGHT,
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


def imu_samples(rate_hz: float, start_s: float, end_s: float, seed: int) -> NDArray[np.float64]:
    """(N, 7) `[t, ax, ay, az, gx, gy, gz]` at the sensor's own rate with clock jitter."""
    rng = np.random.default_rng(seed + 11)
    count = int((end_s - start_s) * rate_hz)
    t = start_s + np.arange(count) / rate_hz + rng.normal(0, 0.05 / rate_hz, count)
    t.sort()
    accel = np.stack([0.3 * np.sin(1.1 * t), 0.2 * np.cos(0.7 * t), 9.81 + 0.1 * np.sin(2.3 * t)])
    gyro = np.stack([0.05 * np.sin(0.9 * t), 0.04 * np.cos(1.3 * t), 0.02 * np.sin(0.4 * t)])
    values = np.concatenate([accel, gyro]).T + rng.normal(0, 0.01, (count, 6))
    return np.column_stack([t, values])


def _write_imu(case: RealisticCase, directory: Path, frames: int, seed: int) -> str | None:
    if case.imu == "none":
        return None
    if case.imu == "frame_synced":
        np.save(directory / "imu.npy", scene.imu_rows(frames, case.fps, seed), allow_pickle=False)
        return "imu.npy"
    rate = float(case.imu[3:])  # npy200 -> 200.0, csv100 -> 100.0
    # The sensor starts a little before the camera and stops a little after.
    samples = imu_samples(rate, -0.05, case.duration_s + 0.05, seed)
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


def write_case(case: RealisticCase, out_dir: Path, seed: int = 0) -> Path:
    """Write one case's episode folder (`episode.json` last, atomically); returns it."""
    episode_id = f"{case.name.replace('_', '-')}-{seed:04d}"
    directory = out_dir / episode_id
    if (directory / COMPLETION_MARKER).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    ext = "mkv" if case.container == "mkv" else "mp4"
    main = f"head.{ext}" if case.second_camera_offset_s is not None else f"video.{ext}"
    frames = _video(case, directory / main, seed)
    meta: dict[str, object] = {
        "episode_id": episode_id,
        "device_id": f"rig{seed % 7:02d}",
        "session_id": f"sess-{seed:04d}-{case.name[:40].replace('_', '-')}",
        "started_at": (datetime(2026, 6, 1, tzinfo=UTC) + timedelta(minutes=seed)).isoformat(),
        "video": main,
        "tags": ["synthetic", "realistic", f"codec={case.codec}", *case.tags],
    }
    if case.second_camera_offset_s is not None:
        wrist = RealisticCase(**{**case.__dict__, "name": case.name + "_wrist"})
        _video(wrist, directory / "wrist.mp4", seed + 1)
        meta["videos"] = {
            "head": main,
            "wrist": {"file": "wrist.mp4", "offset_s": case.second_camera_offset_s},
        }
    imu = _write_imu(case, directory, frames, seed)
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
    tmp = directory / (COMPLETION_MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, directory / COMPLETION_MARKER)
    return directory


def write_realistic(out_dir: Path, names: list[str] | None = None, seed: int = 0) -> list[Path]:
    return [write_case(c, out_dir, seed) for c in realistic_cases() if not names or c.name in names]
