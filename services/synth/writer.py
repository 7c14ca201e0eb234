"""`egoline synth`: write realistic, deterministic synthetic episodes (video + IMU + metadata).

Layout: OUT/<episode_id>/{video.mp4|video.mkv, imu.npy, episode.json}; `episode.json` is written
last and is the completion marker the upload agent waits for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import numpy as np

from services.agent.recordings import COMPLETION_MARKER as MARKER
from services.media.av_io import EncodeStream, corrupt_keyframes, encode_video, remux_prefix
from services.synth import scene
from services.synth.ebml import shift_block_timestamps


class Defect(StrEnum):
    TRUNCATED = "truncated"
    CORRUPT_PACKETS = "corrupt_packets"
    NON_MONOTONIC = "non_monotonic_timestamps"
    IMU_MISMATCH = "imu_row_mismatch"
    ZERO_BYTE = "zero_byte"
    NOT_VIDEO = "not_video"


@dataclass(frozen=True)
class EpisodeSpec:
    episode_id: str
    device_id: str
    session_id: str
    started_at: datetime
    seed: int
    duration_s: float
    fps: int
    width: int
    height: int
    codec: str
    container: str
    depth: bool
    defect: Defect | None


def plan_episodes(
    count: int,
    seed: int = 0,
    duration_s: tuple[float, float] = (4.0, 6.0),
    fps: int = 30,
    width: int = 320,
    height: int = 240,
    codecs: tuple[str, ...] = ("h264",),
    containers: tuple[str, ...] = ("mp4",),
    depth: bool = False,
    defects: tuple[Defect, ...] = (),
    devices: int = 4,
) -> list[EpisodeSpec]:
    """Deterministic episode specs: the same arguments always give the same episodes.

    The first len(defects) episodes carry one defect each, in order; the rest are clean.
    Codecs and containers cycle over the episodes; a multi-stream (RGB + depth) episode is
    always MKV.
    """
    rng = np.random.default_rng(seed)
    base = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=int(seed % 365))
    specs = []
    for i in range(count):
        device = f"dev{(seed * 7 + i) % devices:03d}"
        session = f"{device}-s{seed:04d}-{i // 3:05d}"  # a few episodes per session
        defect = defects[i] if i < len(defects) else None
        container = containers[i % len(containers)]
        if depth or defect is Defect.NON_MONOTONIC:
            container = "mkv"
        specs.append(
            EpisodeSpec(
                episode_id=f"ep{seed:04d}-{i:06d}",
                device_id=device,
                session_id=session,
                started_at=base + timedelta(minutes=7 * i),
                seed=seed * 100_003 + i,
                duration_s=round(float(rng.uniform(*duration_s)), 3),
                fps=fps,
                width=width,
                height=height,
                codec=codecs[i % len(codecs)],
                container=container,
                depth=depth,
                defect=defect,
            )
        )
    return specs


def write_episode(spec: EpisodeSpec, out_dir: Path) -> Path:
    """Write one episode directory; returns it. Idempotent: a finished episode is kept."""
    directory = out_dir / spec.episode_id
    if (directory / MARKER).exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    frames = max(1, round(spec.duration_s * spec.fps))
    video = directory / f"video.{spec.container}"
    fmt = "matroska" if spec.container == "mkv" else "mp4"
    streams = [
        EncodeStream(
            scene.rgb_frames(frames, spec.width, spec.height, spec.seed),
            spec.codec,
            spec.width,
            spec.height,
        )
    ]
    if spec.depth:
        streams.append(
            EncodeStream(
                scene.depth_frames(frames, spec.width, spec.height, spec.seed),
                "h264",
                spec.width,
                spec.height,
            )
        )
    if spec.defect in (Defect.ZERO_BYTE, Defect.NOT_VIDEO):
        rng = np.random.default_rng(spec.seed)
        payload = b"" if spec.defect is Defect.ZERO_BYTE else rng.bytes(64 * 1024)
        video.write_bytes(payload)
    else:
        encode_video(video, streams, fps=spec.fps, gop=spec.fps, container_format=fmt)
        _apply_file_defect(spec, video)
    imu = scene.imu_rows(
        frames - (7 if spec.defect is Defect.IMU_MISMATCH else 0), spec.fps, spec.seed
    )
    np.save(directory / "imu.npy", imu, allow_pickle=False)
    meta = {
        "episode_id": spec.episode_id,
        "device_id": spec.device_id,
        "session_id": spec.session_id,
        "started_at": spec.started_at.isoformat(),
        "fps": spec.fps,
        "frames": frames,
        "video": video.name,
        "imu": "imu.npy",
        "tags": ["synthetic", f"codec={spec.codec}"],
        "synthetic": {k: str(v) for k, v in asdict(spec).items()},
    }
    tmp = directory / (MARKER + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, directory / MARKER)
    return directory


def _apply_file_defect(spec: EpisodeSpec, video: Path) -> None:
    if spec.defect is Defect.TRUNCATED:
        data = video.read_bytes()
        video.write_bytes(data[: int(len(data) * 0.6)])
    elif spec.defect is Defect.CORRUPT_PACKETS:
        clean = video.with_name("clean" + video.suffix)
        video.rename(clean)
        corrupt_keyframes(clean, video, seed=spec.seed)
        clean.unlink()
    elif spec.defect is Defect.NON_MONOTONIC:
        data = video.read_bytes()
        blocks = spec.fps * 2  # two seconds in: five blocks jump 400 ms back
        video.write_bytes(shift_block_timestamps(data, blocks, 5, -400))


def write_from_templates(
    specs: list[EpisodeSpec],
    out_dir: Path,
    templates: int = 3,
    crf: int = 30,
    on_done: Callable[[EpisodeSpec], None] = lambda _spec: None,
) -> list[Path]:
    """Long, high-resolution episodes fast: encode a few template videos as long as the longest
    episode (H.264 MP4, fast YUV scene), then make each episode a keyframe-aligned prefix of one
    of them, remuxed with its id in the container title (so every file is distinct), plus its
    own IMU. For benchmarks; `write_episode` stays the general path (codecs, defects)."""
    if not specs:
        return []
    longest = max(s.duration_s for s in specs)
    fps, width, height = specs[0].fps, specs[0].width, specs[0].height
    template_dir = out_dir.parent / ".templates"
    template_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in range(templates):
        path = template_dir / f"t{t}-{width}x{height}-{fps}-{longest:.0f}-{crf}.mp4"
        if not path.exists():
            frames = round(longest * fps) + fps
            tmp = path.with_suffix(".partial.mp4")
            encode_video(
                tmp,
                [
                    EncodeStream(
                        scene.yuv_scroll_frames(frames, width, height, 7919 * (t + 1)),
                        "h264",
                        width,
                        height,
                        yuv=True,
                        crf=crf,
                    )
                ],
                fps=fps,
                gop=fps,
                container_format="mp4",
            )
            os.replace(tmp, path)
        paths.append(path)
    out = []
    for i, spec in enumerate(specs):
        directory = out_dir / spec.episode_id
        if not (directory / MARKER).exists():
            directory.mkdir(parents=True, exist_ok=True)
            whole_seconds = max(1.0, float(int(spec.duration_s)))  # cut on a keyframe (1 s GOP)
            frames = remux_prefix(
                paths[i % templates], directory / "video.mp4", whole_seconds, spec.episode_id
            )
            np.save(
                directory / "imu.npy", scene.imu_rows(frames, fps, spec.seed), allow_pickle=False
            )
            meta = {
                "episode_id": spec.episode_id,
                "device_id": spec.device_id,
                "session_id": spec.session_id,
                "started_at": spec.started_at.isoformat(),
                "fps": fps,
                "frames": frames,
                "video": "video.mp4",
                "imu": "imu.npy",
                "tags": ["synthetic", "codec=h264"],
                "synthetic": {"template": i % templates, "duration_s": whole_seconds},
            }
            tmp_marker = directory / (MARKER + ".tmp")
            tmp_marker.write_text(json.dumps(meta, indent=2))
            os.replace(tmp_marker, directory / MARKER)
        on_done(spec)
        out.append(directory)
    return out
