"""Synthetic shard corpora written straight into the object store, with their manifest.

For the reader's benchmark and tests: a few real clips are encoded once (a synthetic episode cut
at keyframes, remuxed without re-encoding, as the shard stage does), then reused under distinct
clip keys to fill shards of the real format (`services.shard.core.write_tar`, content-addressed
keys) up to a target size. The manifest is a real manifest file (`with_metadata`,
`write_ipc`) carrying the columns the warehouse query would give for these clips, minus the
warehouse-only ones (verdict, raw lineage). Nothing goes through Kafka or Postgres, so ~2 GB of
shards take about a minute instead of an ingest run.
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from services.common.objectstore import ObjectStore
from services.manifest.query import ManifestFilter
from services.manifest.write import with_metadata, write_ipc
from services.media.av_io import remux_clips
from services.shard.core import shard_keys, write_tar
from services.synth.writer import plan_episodes, write_episode


@dataclass(frozen=True)
class ClipMedia:
    mp4: bytes
    frames: int
    imu: NDArray[np.float32]
    fps: int
    width: int
    height: int


def encode_clip_templates(
    work_dir: Path, count: int, clip_s: int, width: int, height: int, fps: int = 30, seed: int = 0
) -> list[ClipMedia]:
    """`count` distinct real H.264 clips of `clip_s` seconds: one synthetic episode (keyframe
    every second) cut at whole seconds."""
    if count < 1 or clip_s < 1:
        raise ValueError("count and clip_s must be >= 1")
    (spec,) = plan_episodes(
        1, seed=seed, duration_s=(count * clip_s, count * clip_s), fps=fps, width=width,
        height=height,
    )  # fmt: skip
    directory = write_episode(spec, work_dir)
    imu = np.load(directory / "imu.npy", allow_pickle=False)
    cuts = [float(i * clip_s) for i in range(count + 1)]
    templates = []
    first = 0
    for mp4, frames in remux_clips(directory / "video.mp4", 0, cuts):
        templates.append(ClipMedia(mp4, frames, imu[first : first + frames], fps, width, height))
        first += frames
    return templates


def _npy(array: NDArray[np.float32]) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_synthetic_corpus(
    store: ObjectStore,
    templates: list[ClipMedia],
    total_bytes: int,
    shard_bytes: int,
    scratch: Path,
    manifest_path: Path,
    clips_per_episode: int = 6,
    pipeline_version: str = "synth",
    on_bytes: Callable[[int], None] = lambda _n: None,
    clips_per_shard: int | None = None,
    max_clips: int | None = None,
    run: str | None = None,
) -> Path:
    """Write shards holding about `total_bytes` of clips (templates cycled under fresh clip
    keys) into `store`, and their manifest to `manifest_path`; returns the manifest path.

    A shard closes at `shard_bytes` or, when given, at `clips_per_shard` clips; the corpus ends
    at `total_bytes` or, when given, at `max_clips` clips. `run` names the
    clips (`synth-<run>-...`); a fixed one with the same templates gives the same shard bytes,
    hence the same content-addressed keys, and a shard already stored is not sent again."""
    if not templates or total_bytes <= 0 or shard_bytes <= 0:
        raise ValueError("need templates and positive sizes")
    if clips_per_shard is not None and clips_per_shard < 1:
        raise ValueError("clips_per_shard must be >= 1")
    run = run or uuid.uuid4().hex[:8]
    scratch.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    written = clip_no = 0
    while written < total_bytes and (max_clips is None or clip_no < max_clips):
        members: list[tuple[str, bytes]] = []
        clip_rows: list[dict[str, object]] = []
        size = 0
        while (
            size < shard_bytes
            and written + size < total_bytes
            and (clips_per_shard is None or len(clip_rows) < clips_per_shard)
            and (max_clips is None or clip_no < max_clips)
        ):
            media = templates[clip_no % len(templates)]
            episode_id = f"synth-{run}-{clip_no // clips_per_episode:06d}"
            index = clip_no % clips_per_episode
            key = f"{episode_id}_{index:05d}"
            meta = {
                "clip_key": key,
                "episode_id": episode_id,
                "device_id": f"dev{clip_no % 4:03d}",
                "session_id": episode_id,
                "clip_index": index,
                "frame_count": media.frames,
                "fps": media.fps,
                "codec": "h264",
                "width": media.width,
                "height": media.height,
                "pipeline_version": pipeline_version,
            }
            parts = [
                (f"{key}.mp4", media.mp4),
                (f"{key}.imu.npy", _npy(media.imu)),
                (f"{key}.json", json.dumps(meta, sort_keys=True).encode()),
            ]
            members += parts
            clip_rows.append(meta)
            size += sum(len(data) for _, data in parts)
            clip_no += 1
        path = scratch / f"shard-{uuid.uuid4().hex}.tar"
        with path.open("w+b") as sink:
            spans = write_tar(sink, [(n, len(d), io.BytesIO(d)) for n, d in members])
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(8 << 20):
                digest.update(chunk)
        shard_key, _ = shard_keys(pipeline_version, digest.hexdigest())
        if not store.exists(shard_key):
            store.put_file(shard_key, path, "application/x-tar", single_put_max=path.stat().st_size)
        path.unlink()
        where = {s.name: s for s in spans}
        for meta in clip_rows:
            key = str(meta["clip_key"])
            mp4, imu, js = where[f"{key}.mp4"], where[f"{key}.imu.npy"], where[f"{key}.json"]
            rows.append(
                {
                    "shard_key": shard_key,
                    "byte_offset": mp4.offset,
                    "length": mp4.length,
                    "imu_offset": imu.offset,
                    "imu_length": imu.length,
                    "json_offset": js.offset,
                    "json_length": js.length,
                    **{k: meta[k] for k in ("episode_id", "device_id", "session_id")},
                    "clip_index": meta["clip_index"],
                    "frame_count": meta["frame_count"],
                    "split": "train",
                    "codec": "h264",
                    "width": meta["width"],
                    "height": meta["height"],
                    "fps": meta["fps"],
                    "pipeline_version": pipeline_version,
                }
            )
        written += size
        on_bytes(size)
    flt = ManifestFilter(pipeline_version=pipeline_version)
    table = with_metadata(pa.Table.from_pylist(rows), flt, "-- synthetic corpus, no query")
    write_ipc(table, manifest_path)
    return manifest_path
