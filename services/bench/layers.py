"""`egoline bench layers`: release a calibration layer for every episode of a large warehouse,
and pin manifests to it.

In one run, on the configured Postgres and object store (the embedded stack by default):
1. seed a separate database (`<db>_bench_layers`) with N episodes of 10 clips by bulk SQL
   (`services/bench/manifest.py`'s seed, not timed);
2. generate a calibration layer for every episode (one camera each, its intrinsics,
   distortion and extrinsics) as JSON Lines, and ingest it as `v1` with the command's own
   code (read, schema-check, canonical rows, COPY in one transaction): `layer_ingest_s`;
3. build a manifest pinned to `calibration=v1`, ingest `v2` from Parquet (a newer version),
   build the pinned manifest again (`byte_identical_rebuild`), and build the unpinned one;
4. over all of it, count the object store's GET requests from the server's own request log
   (the embedded moto's access log, `<stack dir>/s3.log`): `video_bytes_read` is the size of
   every object under `raw/`, `shards/` or `index/` that was read, `s3_get_requests` every GET.
Then every step of `AFTER_BUILD_STEPS` runs on the built manifests (more figures on the same
warehouse: the manifest diff, reverse-lineage lookups) and adds its fields to the JSON line.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine

from schemas.layers import LayerKind
from services.bench.lineage_bench import forget_lineage, time_used_by
from services.bench.manifest import CLIPS_PER_EPISODE, bench_database
from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.manifest.build import BuiltManifest, build_manifest
from services.manifest.diff import diff_manifests
from services.manifest.load import load_manifest
from services.manifest.query import ManifestFilter
from services.metadata.layer_ingest import read_layer_file, store_layer
from services.metadata.warehouse import make_engine

Log = Callable[[str], None]
VIDEO_PREFIXES = ("raw/", "shards/", "index/")  # every key that holds video or its packets


@dataclass(frozen=True)
class LayersBenchRun:
    """What the bench built, for the steps after it: the bench database (settings, engine),
    the object store, the manifests and a scratch directory that is removed afterwards."""

    settings: Settings
    engine: Engine
    store: ObjectStore
    episodes: int
    pinned: BuiltManifest  # calibration=v1
    rebuilt: BuiltManifest  # calibration=v1 again, after v2 was ingested
    unpinned: BuiltManifest  # no layer
    out_dir: Path


BenchStep = Callable[[LayersBenchRun, Log], dict[str, Any]]

#: `--used-by` is timed after this many manifests are registered (issue 19's figure)
USED_BY_MANIFESTS = 100
USED_BY_LOOKUPS = 1000


def diff_step(run: LayersBenchRun, log: Log) -> dict[str, Any]:
    """`manifest diff` of the unpinned manifest against the pinned one (memory-mapped files,
    no SQL): the same clips, the calibration layer dropped."""
    log("diffing the pinned manifest against the unpinned one")
    started = time.perf_counter()
    diff = diff_manifests(
        load_manifest(run.pinned.local_path), load_manifest(run.unpinned.local_path)
    )
    diff_s = time.perf_counter() - started
    return {
        "diff_s": round(diff_s, 3),
        "diff_identical_clips": not (
            diff.episodes_added or diff.episodes_removed or diff.episodes_changed
        ),
        "diff_layers_changed": {k: list(v) for k, v in diff.layers_changed.items()},
    }


def used_by_step(run: LayersBenchRun, log: Log) -> dict[str, Any]:
    """`lineage --episode ID --used-by` for random episodes once `USED_BY_MANIFESTS`
    manifests (the pinned and unpinned ones built here, the rest indexed from seeded
    memberships) are registered with a training run each."""
    figures = time_used_by(
        run.settings,
        run.engine,
        [run.pinned.manifest_id, run.unpinned.manifest_id],
        USED_BY_MANIFESTS,
        1.0,
        USED_BY_LOOKUPS,
        log,
    )
    return {
        "used_by_manifests": figures["manifests"],
        "used_by_member_rows": figures["member_rows"],
        "used_by_lookups": figures["lookups"],
        "used_by_wrong_answers": figures["wrong_answers"],
        "used_by_p50_ms": figures["used_by_p50_ms"],
        "used_by_p99_ms": figures["used_by_p99_ms"],
        "used_by_max_ms": figures["used_by_max_ms"],
    }


# Steps run after the builds, in order, each returning fields for the JSON line.
AFTER_BUILD_STEPS: list[BenchStep] = [diff_step, used_by_step]


def calibration_row(episode: int, version: int) -> dict[str, Any]:
    """A plausible per-episode calibration (1280x720, OpenCV 5-coefficient distortion, the
    camera 12 cm above and 3 cm ahead of the rig origin); its values vary like 97 rigs (97
    distinct calibrations per version)."""
    shift = (episode % 97) / 97.0
    return {
        "episode_id": f"ep{episode:09d}",
        "camera": "main",
        "width": 1280,
        "height": 720,
        "fx": 610.0 + shift + version,
        "fy": 611.0 + shift + version,
        "cx": 640.0 + shift,
        "cy": 360.0 - shift,
        "distortion_model": "opencv",
        "distortion": [0.08, -0.021, 0.0004, -0.0002, 0.003 * version],
        "extrinsics": [1.0, 0, 0, 0, 0, 1.0, 0, 0.03, 0, 0, 1.0, 0.12, 0, 0, 0, 1.0],
    }


def write_jsonl(path: Path, episodes: int, version: int) -> int:
    with path.open("w") as out:
        for episode in range(episodes):
            out.write(json.dumps(calibration_row(episode, version)) + "\n")
    return path.stat().st_size


def write_parquet(path: Path, episodes: int, version: int) -> int:
    pq.write_table(
        pa.Table.from_pylist([calibration_row(e, version) for e in range(episodes)]), path
    )
    return path.stat().st_size


_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+')


@dataclass
class S3RequestLog:
    """The object store's requests from its own side: the lines the embedded moto server
    appends to its access log while the bench runs (None where the object store is not the
    embedded one: no log to read)."""

    path: Path
    bucket: str
    start: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, key)

    @classmethod
    def of(cls, settings: Settings) -> S3RequestLog | None:
        path = settings.stack_dir / "s3.log"
        return cls(path, settings.s3.bucket) if path.exists() else None

    def begin(self) -> None:
        self.start = self.path.stat().st_size

    def end(self) -> None:
        with self.path.open("rb") as log:
            log.seek(self.start)
            text = log.read().decode(errors="replace")
        for line in text.splitlines():
            found = _REQUEST.search(line)
            if found:
                method, target = found.groups()
                path = unquote(urlsplit(target).path).lstrip("/")
                bucket, _, key = path.partition("/")
                if bucket == self.bucket:
                    self.requests.append((method, key))

    def gets(self) -> list[str]:
        return [key for method, key in self.requests if method == "GET" and key]


def bench_layers(settings: Settings, episodes: int, keep: bool, log: Log) -> dict[str, Any]:
    store = object_store(settings)
    out_dir = Path(tempfile.mkdtemp(prefix="egoline-bench-layers-"))
    requests = S3RequestLog.of(settings)
    try:
        rows = episodes * CLIPS_PER_EPISODE
        with bench_database(settings, rows, keep, log, suffix="_bench_layers") as bench:
            forget_lineage(bench)  # a kept database: what an earlier run indexed
            jsonl, parquet = out_dir / "calibration-v1.jsonl", out_dir / "calibration-v2.parquet"
            jsonl_bytes = write_jsonl(jsonl, episodes, 1)
            parquet_bytes = write_parquet(parquet, episodes, 2)
            log(f"calibration for {episodes:,} episodes: {jsonl_bytes / 2**20:.1f} MiB JSONL")
            engine = make_engine(bench)
            if requests is not None:
                requests.begin()
            url = bench.database_libpq_url
            started = time.perf_counter()
            content = read_layer_file(LayerKind.CALIBRATION, jsonl)
            check_s = time.perf_counter() - started
            stored = store_layer(url, LayerKind.CALIBRATION, "v1", content, "bench", jsonl.name)
            ingest_s = time.perf_counter() - started
            log(f"ingested v1 ({stored.rows:,} rows) in {ingest_s:.2f} s")
            again = store_layer(url, LayerKind.CALIBRATION, "v1", content, "bench", jsonl.name)
            pinned_flt = ManifestFilter(verdicts=[], layers={"calibration": "v1"})
            log("building the manifest pinned to calibration=v1")
            pinned = build_manifest(url, engine, store, pinned_flt, out_dir / "pinned")
            started = time.perf_counter()
            newer = read_layer_file(LayerKind.CALIBRATION, parquet)
            v2 = store_layer(url, LayerKind.CALIBRATION, "v2", newer, "bench", parquet.name)
            parquet_s = time.perf_counter() - started
            log(f"ingested v2 from Parquet in {parquet_s:.2f} s; rebuilding the pinned manifest")
            rebuilt = build_manifest(url, engine, store, pinned_flt, out_dir / "rebuilt")
            log("building the unpinned manifest")
            unpinned = build_manifest(
                url, engine, store, ManifestFilter(verdicts=[]), out_dir / "unpinned"
            )
            if requests is not None:
                requests.end()
            result: dict[str, Any] = {
                "episodes": episodes,
                "layer_rows": stored.rows,
                "layer_file_mb": round(jsonl_bytes / 2**20, 1),
                "layer_ingest_s": round(ingest_s, 3),
                "layer_check_s": round(check_s, 3),
                "layer_store_s": round(stored.store_s, 3),
                "layer_rows_per_s": round(stored.rows / ingest_s),
                "same_version_again_created": again.created,
                "parquet_ingest_s": round(parquet_s, 3),
                "parquet_file_mb": round(parquet_bytes / 2**20, 1),
                "newer_version_rows": v2.rows,
                **_s3_figures(requests, store),
                "manifest_rows": pinned.rows,
                "pinned_build_s": round(pinned.query_s + pinned.explode_s + pinned.write_s, 3),
                "unpinned_build_s": round(
                    unpinned.query_s + unpinned.explode_s + unpinned.write_s, 3
                ),
                "pinned_file_mb": round(pinned.size_bytes / 2**20, 1),
                "unpinned_file_mb": round(unpinned.size_bytes / 2**20, 1),
                "pinned_layers": pinned.layers,
                "byte_identical_rebuild": rebuilt.manifest_id == pinned.manifest_id
                and rebuilt.local_path.read_bytes() == pinned.local_path.read_bytes(),
            }
            run = LayersBenchRun(bench, engine, store, episodes, pinned, rebuilt, unpinned, out_dir)
            for step in AFTER_BUILD_STEPS:
                result.update(step(run, log))
            engine.dispose()
            for built in {pinned.object_key, unpinned.object_key}:
                store.delete(built)
        return result
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def _s3_figures(requests: S3RequestLog | None, store: ObjectStore) -> dict[str, Any]:
    """GETs the object store served while the layer was released and the manifests built:
    every one, and the bytes of those of video objects (whole objects: the log carries no
    ranges, so this is an upper bound). None without the embedded store's log."""
    if requests is None:
        return {"video_bytes_read": None, "s3_get_requests": None, "s3_requests": None}
    video = [key for key in requests.gets() if key.startswith(VIDEO_PREFIXES)]
    sizes = [info.size for key in video if (info := store.stat(key)) is not None]
    return {
        "video_bytes_read": sum(sizes),
        "video_get_requests": len(video),
        "s3_get_requests": len(requests.gets()),
        "s3_requests": len(requests.requests),
    }
