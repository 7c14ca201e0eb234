"""`egoline bench first-batch`: from a warehouse of N episodes to the first decoded training
batch, cold, with each step timed.

In one run, on the configured Postgres and object store (the embedded stack by default):
1. real shards: `real_shards` shards of `clips_per_shard` real H.264 clips each (three encoded
   templates cycled under distinct clip keys, the shard package's own tar writer,
   content-addressed keys: `services.synth.shards`), PUT into the object store;
2. the warehouse: a database beside the real one (`<db>_bench_first_batch`, migrated) seeded
   with N episodes of 10 clips by `bench manifest`'s bulk SQL, except that every clip row
   reuses the bytes of a real clip (`first_batch_seed.sql`: clip i is real slot i mod slots,
   laid out shard by shard): its shard key, byte ranges, frame count and duration are a real
   clip's, so every row of the manifest reads and decodes. Not timed (`seed_s`);
3. timed: the manifest build (`build_manifest`: query, explode, Arrow IPC write to a local
   file; the upload to the object store is reported apart as `publish_s`: a trainer on the
   node that built the manifest maps the local file), the load (`load_manifest`, memory map),
   and the first training batch: a `ClipLoader` on an empty node cache (a fresh directory),
   the epoch's order over every row, then `batch` clips read through it (one ranged GET of a
   real shard each, prefetch as configured) and decoded by the reader to their first
   `frames_per_clip` RGB frames, stacked into one array (batch, frames, height, width, 3);
4. checked: every clip of the batch decoded to min(frames_per_clip, its row's frame_count)
   frames (all of them with `frames_per_clip` 0), the batch's spans are distinct (each came
   from the object store, none from the cache);
5. the baseline in the same run: `bench manifest`'s file-by-file walk of shard indexes on
   `naive_rows` rows, extrapolated to N episodes' rows, plus the same first batch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from services.bench.manifest import (
    CLIPS_PER_EPISODE,
    Log,
    SeedLayout,
    bench_database,
    fresh_memory_cost,
    naive_walk,
    settle,
    write_naive_corpus,
)
from services.common.localcache import LocalCache
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest
from services.manifest.query import ManifestFilter
from services.metadata.warehouse import make_engine
from services.reader.cache import ClipCache
from services.reader.clips import clip_span
from services.reader.loader import ClipLoader
from services.synth.shards import encode_clip_templates, write_synthetic_corpus

SEED_SQL = Path(__file__).with_name("first_batch_seed.sql")
SHARD_PREFIX = "bench-first-batch"  # real shards are shards/bench-first-batch/<aa>/<sha>.tar
MB = 1024 * 1024


@dataclass(frozen=True)
class BenchShape:
    """What `bench first-batch` builds and reads."""

    episodes: int
    batch: int = 64
    frames_per_clip: int = 16  # 0: every frame of each clip
    frame_height: int = 224  # frames scaled to this many rows, aspect kept (0: as stored)
    workers: int = 2  # readers sharing the order, as a DataLoader's workers
    real_shards: int = 2
    clips_per_shard: int = 256
    clip_s: int = 10
    width: int = 1280
    height: int = 720
    naive_rows: int = 5120

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.batch < 1 or self.workers < 1:
            raise ValueError("episodes, batch and workers must be >= 1")
        if self.frames_per_clip < 0 or self.frame_height < 0:
            raise ValueError("frames_per_clip and frame_height must be >= 0")
        if self.real_shards < 1 or self.clips_per_shard < 1:
            raise ValueError("real_shards and clips_per_shard must be >= 1")


def real_layout(store: ObjectStore, manifest: Path) -> SeedLayout:
    """The seed parameters pointing clip rows at the real clips of `manifest` (slot j is its
    row j: shard by shard, in shard order)."""
    table = load_manifest(manifest)
    column = {name: table.column(name).to_pylist() for name in table.column_names}
    keys = list(dict.fromkeys(str(k) for k in column["shard_key"]))
    sizes = []
    for key in keys:
        info = store.stat(key)
        if info is None:
            raise RuntimeError(f"real shard {key} is not in the object store")
        sizes.append(info.size)
    counts = [column["shard_key"].count(k) for k in keys]
    if len(set(counts)) != 1 or column["shard_key"] != [k for k in keys for _ in range(counts[0])]:
        raise ValueError("the seed needs real shards of equal clip counts, laid out in order")
    params: dict[str, Any] = {
        "slots": table.num_rows,
        "slots_per_shard": counts[0],
        "shard_keys": keys,
        "shard_sha256": [k.rsplit("/", 1)[1].removesuffix(".tar") for k in keys],
        "shard_bytes": sizes,
        "shard_clips": counts,
        "slot_mp4_offset": column["byte_offset"],
        "slot_mp4_length": column["length"],
        "slot_imu_offset": column["imu_offset"],
        "slot_imu_length": column["imu_length"],
        "slot_json_offset": column["json_offset"],
        "slot_json_length": column["json_length"],
        "slot_frame_count": column["frame_count"],
        "slot_duration_s": [
            frames / fps for frames, fps in zip(column["frame_count"], column["fps"], strict=True)
        ],
    }
    return SeedLayout(SEED_SQL, params, tuple(sorted(keys)))


def write_real_shards(
    settings: Settings, store: ObjectStore, shape: BenchShape, work: Path, log: Log
) -> SeedLayout:
    """Real shards in the object store (kept ones are not sent again: a fixed run name and the
    cached templates give the same bytes, so the same keys) and the layout pointing at them."""
    templates = encode_clip_templates(
        settings.stack_dir / f"bench-first-batch-templates-{shape.width}x{shape.height}"
        f"-{shape.clip_s}s",
        count=3,
        clip_s=shape.clip_s,
        width=shape.width,
        height=shape.height,
    )
    clips = shape.real_shards * shape.clips_per_shard
    log(f"real shards: {shape.real_shards} of {shape.clips_per_shard} clips (not timed)")
    manifest = write_synthetic_corpus(
        store,
        templates,
        total_bytes=1 << 62,
        shard_bytes=1 << 62,
        scratch=work / "scratch",
        manifest_path=work / "real.arrow",
        pipeline_version=SHARD_PREFIX,
        clips_per_shard=shape.clips_per_shard,
        max_clips=clips,
        run="first-batch",
    )
    return real_layout(store, manifest)


@dataclass(frozen=True)
class FirstBatch:
    frames: NDArray[np.uint8]  # (batch, frames, height, width, 3) RGB
    rows: list[dict[str, Any]]  # the batch's manifest rows
    decoded: list[int]  # frames decoded per clip
    first_clip_s: float  # to the first decoded clip: the order's first piece, one read, decode
    read_s: float  # the whole batch read and decoded


def _read_part(
    loader: ClipLoader, part: int, parts: int, count: int, started: float
) -> tuple[list[NDArray[np.uint8]], list[dict[str, Any]], float]:
    """The first `count` clips of reader `part` of `parts` (epoch 0), decoded; and the time
    from `started` to its first clip."""
    frames: list[NDArray[np.uint8]] = []
    rows: list[dict[str, Any]] = []
    first_clip_s = 0.0
    if count == 0:
        return frames, rows, first_clip_s
    clips = loader.clips(epoch=0, part=part, parts=parts)
    try:
        for clip in clips:
            if clip.frames is None:
                raise ValueError("the loader must decode (decode=True)")
            frames.append(clip.frames)
            rows.append(clip.row)
            if len(rows) == 1:
                first_clip_s = time.perf_counter() - started
            if len(rows) == count:
                break
    finally:
        clips.close()  # stops this reader's prefetcher at the batch
    return frames, rows, first_clip_s


def first_batch(loader: ClipLoader, batch: int, workers: int = 1) -> FirstBatch:
    """The first `batch` clips of epoch 0 through the reader, decoded, as one array.

    `workers` readers share the order as a DataLoader's workers do (`parts`: reader w takes
    positions w, w + workers, ...), each in its own thread with its own prefetcher (PyAV
    decodes without the GIL); the batch is positions 0..batch-1 of the epoch, as with one."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        parts = list(
            pool.map(
                lambda w: _read_part(loader, w, workers, len(range(w, batch, workers)), started),
                range(workers),
            )
        )
    frames: list[NDArray[np.uint8]] = []
    rows: list[dict[str, Any]] = []
    for k in range(max(len(p[0]) for p in parts)):  # back to epoch order: position w + k * W
        for part_frames, part_rows, _ in parts:
            if k < len(part_rows):
                frames.append(part_frames[k])
                rows.append(part_rows[k])
    if not frames:
        raise ValueError("the manifest has no rows")
    decoded = [len(f) for f in frames]
    usable = min(decoded)  # a batch array needs one frame count (all equal when checks pass)
    stacked = np.stack([f[:usable] for f in frames])
    first_clip_s = min(p[2] for p in parts if p[1])
    return FirstBatch(stacked, rows, decoded, first_clip_s, time.perf_counter() - started)


def expected_frames(row: dict[str, Any], frames_per_clip: int | None) -> int:
    """What decoding a row's clip must give: its frame count, capped at `frames_per_clip`."""
    count = int(row["frame_count"])
    return count if frames_per_clip is None else min(count, frames_per_clip)


def bench_first_batch(
    settings: Settings, shape: BenchShape, keep: bool, log: Log, settle_limit_s: float = 120.0
) -> dict[str, Any]:
    """Seed, then time build + load + first batch (module docstring); `settle_limit_s` bounds
    the wait for a quiet machine before the timed part (0: no wait)."""
    store = object_store(settings)
    work = Path(tempfile.mkdtemp(prefix="egoline-bench-first-batch-", dir=settings.stack_dir))
    rows = shape.episodes * CLIPS_PER_EPISODE
    layout: SeedLayout | None = None
    try:
        layout = write_real_shards(settings, store, shape, work, log)
        real_mb = sum(layout.params["shard_bytes"]) / MB
        seed_started = time.perf_counter()
        with bench_database(
            settings, rows, keep, log, suffix="_bench_first_batch", layout=layout
        ) as bench:
            seed_s = time.perf_counter() - seed_started
            engine = make_engine(bench)
            first_touch = fresh_memory_cost()
            settled_s = settle(limit_s=settle_limit_s)
            load_before = os.getloadavg()
            log(f"timed: manifest build over {rows:,} rows")
            flt = ManifestFilter(verdicts=[])  # every clip
            built = build_manifest(bench.database_libpq_url, engine, store, flt, work / "out")
            engine.dispose()
        build_s = built.query_s + built.explode_s + built.write_s

        log("timed: load (memory map)")
        started = time.perf_counter()
        table = load_manifest(built.local_path)
        load_s = time.perf_counter() - started

        log(f"timed: first batch of {shape.batch} clips, cold cache")
        frames_per_clip = shape.frames_per_clip or None
        cache = LocalCache(work / "cache", cap_bytes=64 << 30, label="first-batch")
        fetched_before = store.bytes_read
        batch_started = time.perf_counter()
        loader = ClipLoader(
            table,
            ClipCache(cache, store),
            seed=0,
            shuffle_buffer=settings.reader.shuffle_buffer,
            prefetch=settings.reader.prefetch_clips,
            decode=True,
            frames_per_clip=frames_per_clip,
            frame_height=shape.frame_height or None,
        )
        loader_s = time.perf_counter() - batch_started
        got = first_batch(loader, shape.batch, shape.workers)
        first_batch_s = time.perf_counter() - batch_started
        fetched = store.bytes_read - fetched_before
        load_after = os.getloadavg()

        expected = [expected_frames(row, frames_per_clip) for row in got.rows]
        spans = [clip_span(row) for row in got.rows]
        log(f"naive: walking {shape.naive_rows:,} rows of shard indexes file by file")
        prefix = f"bench/first-batch/{uuid.uuid4().hex}"
        write_naive_corpus(store, prefix, shape.naive_rows)
        started = time.perf_counter()
        walked = naive_walk(store, prefix)
        naive_s = time.perf_counter() - started
        for key in [*store.list_keys(prefix), built.object_key]:
            store.delete(key)
        if len(walked) != shape.naive_rows:
            raise RuntimeError(f"naive walk found {len(walked)} of {shape.naive_rows} rows")
    finally:
        if layout is not None and not keep:
            for key in layout.keys:
                store.delete(key)
        shutil.rmtree(work, ignore_errors=True)

    time_to_first_batch_s = build_s + load_s + first_batch_s
    naive_build_s = rows / (shape.naive_rows / naive_s)
    return {
        "episodes": shape.episodes,
        "rows": built.rows,
        "seed_s": round(seed_s, 1),
        "real_shards": len(layout.keys),
        "real_clips": layout.params["slots"],
        "real_shard_mb": round(real_mb / len(layout.keys), 1),
        "build_s": round(build_s, 3),
        "rows_per_s": round(built.rows / build_s),
        "query_s": round(built.query_s, 3),
        "explode_s": round(built.explode_s, 3),
        "write_s": round(built.write_s, 3),
        "publish_s": round(built.publish_s, 3),
        "file_mb": round(built.size_bytes / MB, 1),
        "load_s": round(load_s, 4),
        "first_batch_s": round(first_batch_s, 3),
        "loader_s": round(loader_s, 3),
        "first_clip_s": round(got.first_clip_s, 3),
        "read_decode_s": round(got.read_s, 3),
        "time_to_first_batch_s": round(time_to_first_batch_s, 3),
        "batch": len(got.rows),
        "frames_per_clip": shape.frames_per_clip,
        "frame_height": shape.frame_height,
        "workers": shape.workers,
        "batch_shape": list(got.frames.shape),
        "frames_decoded": sum(got.decoded),
        "frames_expected": sum(expected),
        "frame_counts_ok": got.decoded == expected,
        "batch_spans_distinct": len(set(spans)),
        "batch_mb": round(sum(s.length for s in spans) / MB, 1),
        "fetched_mb": round(fetched / MB, 1),
        "cache_misses": cache.counts.misses,
        "prefetch": settings.reader.prefetch_clips,
        "shuffle_buffer": settings.reader.shuffle_buffer,
        "vm_first_touch_s_per_gib": round(first_touch, 3),
        "settle_s": round(settled_s, 1),
        "loadavg_1m": [round(load_before[0], 2), round(load_after[0], 2)],
        "naive_rows": shape.naive_rows,
        "naive_rows_per_s": round(shape.naive_rows / naive_s),
        "naive_build_s_extrapolated": round(naive_build_s),
        "naive_time_to_first_batch_s_extrapolated": round(naive_build_s + first_batch_s),
        "speedup_vs_naive": round((naive_build_s + first_batch_s) / time_to_first_batch_s, 1),
    }
