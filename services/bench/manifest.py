"""`egoline bench manifest`: build and load a manifest over a large warehouse, vs a file walk.

In one run, on the configured Postgres and object store (the embedded stack by default):
1. seed a separate database (`<db>_bench_manifest`, migrated like the real one) with N clip rows
   by bulk SQL (`generate_series`) into the normalized tables, then fill `manifest_episodes`
   with the metadata service's own refresh statement (not timed);
2. the build: `build_manifest` (one query streamed through ADBC/COPY, explode batch by batch,
   Arrow IPC write + sha256, its members COPYed into the reverse-lineage index meanwhile),
   timed with what it waits for the members (`index_s`); publishing the file to the object
   store is timed separately (`publish_s`); then alternately without the index and with it
   again, for `index_cost_fraction` (best of two each);
3. the load: `load_manifest` (memory map) timed, with the process's RSS before and after;
4. the naive approach on a smaller corpus in the same run: real shard tars and shard indexes in
   the object store, walked file by file (list, GET each index, a ranged GET of one clip's
   `.json` per episode for the episode's facts), scaled per row.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg
import pyarrow.compute as pc
from psycopg import sql

from services.common.objectstore import ObjectStore, object_store
from services.common.settings import Settings
from services.manifest.build import build_manifest
from services.manifest.load import load_manifest
from services.manifest.query import ManifestFilter
from services.metadata.core import refresh_all_manifest_episodes
from services.metadata.warehouse import make_engine, upgrade
from services.shard.core import Member, build_tar

CLIPS_PER_EPISODE = 10
EPISODES_PER_SESSION = 4
CLIPS_PER_SHARD = 256
DEVICES = 500
SEED_SQL = Path(__file__).with_name("manifest_seed.sql")

Log = Callable[[str], None]


@contextlib.contextmanager
def bench_database(
    settings: Settings,
    rows: int,
    keep: bool,
    log: Log,
    suffix: str = "_bench_manifest",
    layout: SeedLayout | None = None,
) -> Iterator[Settings]:
    """A migrated database beside the warehouse holding `rows` seeded clips: a kept one from an
    earlier run with `--keep` if it has exactly that (and, with a `layout`, references exactly
    its shards), else a fresh one seeded now. Dropped afterwards unless `keep`."""
    base, _, current = settings.database_libpq_url.rpartition("/")
    name = current.split("?")[0] + suffix
    admin, url = f"{base}/postgres", f"{base}/{name}"
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    bench = settings.model_copy(update={"database_url": url})
    if _seeded_rows(bench) == rows and (layout is None or _seeded_shards(bench) == layout.keys):
        log(f"reusing the {rows:,} rows kept in {name}")
        upgrade(bench)
    else:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(drop)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        upgrade(bench)
        log(f"seeding {rows:,} clip rows (not timed)")
        seed(bench, rows, log, layout)
    # A warehouse in use is vacuumed (autovacuum): the build's heads pass is an index-only scan
    # once the visibility map is set, and a migration that rewrote every row leaves dead ones.
    with psycopg.connect(bench.database_libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE manifest_episodes")
    try:
        yield bench
    finally:
        if not keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(drop)


def _seeded_rows(settings: Settings) -> int | None:
    try:
        with psycopg.connect(settings.database_libpq_url) as conn:
            found = conn.execute("SELECT sum(clip_count) FROM manifest_episodes").fetchone()
    except psycopg.Error:
        return None
    return int(found[0]) if found and found[0] is not None else None


def _seeded_shards(settings: Settings) -> tuple[str, ...] | None:
    try:
        with psycopg.connect(settings.database_libpq_url) as conn:
            keys = conn.execute("SELECT shard_key FROM shards ORDER BY shard_key").fetchall()
    except psycopg.Error:
        return None
    return tuple(str(k) for (k,) in keys)


@dataclass(frozen=True)
class SeedLayout:
    """Where seeded clips point instead of the synthetic geometry: steps of another SQL file
    replacing those of `manifest_seed.sql` with the same label, and their extra parameters
    (e.g. real shards and byte ranges: `services/bench/first_batch.py`)."""

    sql: Path
    params: dict[str, Any]
    keys: tuple[str, ...]  # the shard keys the seeded rows reference, sorted


def read_steps(path: Path) -> list[tuple[str, str]]:
    """(label, statement) of a seed file: blocks starting with `-- step: <label>`."""
    steps: list[tuple[str, str]] = []
    for block in path.read_text().split("-- step: ")[1:]:
        label, _, statement = block.partition("\n")
        steps.append((label.strip(), statement.strip().rstrip(";")))
    return steps


def seed_steps(layout: SeedLayout | None = None) -> list[tuple[str, str]]:
    """(label, statement) of the bulk load, from `manifest_seed.sql`, with the steps of the
    layout's file (if any) in place of the same-labelled ones."""
    steps = read_steps(SEED_SQL)
    if layout is None:
        return steps
    replaced = dict(read_steps(layout.sql))
    unknown = set(replaced) - {label for label, _ in steps}
    if unknown:
        raise ValueError(f"{layout.sql.name} replaces no step named {sorted(unknown)}")
    return [(label, replaced.get(label, statement)) for label, statement in steps]


def seed_parameters(rows: int) -> dict[str, int]:
    """Geometry: 10 clips an episode, 4 episodes a session, 256 clips a shard, 500 devices."""
    return {
        "rows": rows,
        "episodes": max(1, rows // CLIPS_PER_EPISODE),
        "shards": max(1, -(-rows // CLIPS_PER_SHARD)),
        "devices": DEVICES,
        "per_episode": CLIPS_PER_EPISODE,
        "per_session": EPISODES_PER_SESSION,
        "per_shard": CLIPS_PER_SHARD,
    }


def seed(settings: Settings, rows: int, log: Log, layout: SeedLayout | None = None) -> None:
    """Bulk-load `rows` clips shaped like the pipeline's own (ids, raw keys, content-addressed
    shard keys, sha256s), then fill `manifest_episodes` with the metadata service's statement.
    A `layout` points the clips at other shards and byte ranges (see `SeedLayout`)."""
    params: dict[str, Any] = {**seed_parameters(rows), **(layout.params if layout else {})}
    with psycopg.connect(settings.database_libpq_url, autocommit=True) as conn:
        with contextlib.suppress(psycopg.Error):
            # Skip per-row foreign-key triggers for the bulk load where the role may do so.
            conn.execute("SET session_replication_role = replica")
        for label, statement in seed_steps(layout):
            started = time.perf_counter()
            conn.execute(statement.encode(), params)
            log(f"seeded {label} in {time.perf_counter() - started:.1f} s")
    # The metadata service's own refresh statement, over slices of 50k episodes.
    engine = make_engine(settings)
    started = time.perf_counter()
    with engine.begin() as conn:
        for done in refresh_all_manifest_episodes(conn):
            log(f"manifest_episodes: {done:,}/{params['episodes']:,} episodes")
    engine.dispose()
    log(f"manifest_episodes filled in {time.perf_counter() - started:.1f} s")
    with psycopg.connect(settings.database_libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        # Flush the load's dirty pages now, not by the checkpointer during the timed build.
        with contextlib.suppress(psycopg.Error):  # needs pg_checkpoint or superuser
            conn.execute("CHECKPOINT")


def fresh_memory_cost(gib: float = 1.0) -> float:
    """Seconds per GiB to touch memory this process never had, reported beside the figures.

    On this project's VMs freed guest memory goes back to the host at once (virtio-balloon free
    page reporting), so every GiB a build touches fresh costs this again: 0.4 to 3 s/GiB
    measured, the upper end for huge pages. It is why the build keeps its memory to one batch
    and writes around the page cache (docs/performance.md).
    """
    started = time.perf_counter()
    block = np.ones(int(gib * 2**30) // 8, dtype=np.int64)
    del block
    return (time.perf_counter() - started) / gib


def settle(idle_percent: float = 20.0, quiet_s: int = 3, limit_s: float = 120.0) -> float:
    """Wait until the machine is idle (system-wide CPU below `idle_percent` for `quiet_s`
    consecutive seconds, at most `limit_s`), so the timed build does not share the cores with
    what the untimed load left running (autovacuum, the checkpointer, the kernel returning
    freed memory). Returns the seconds waited."""
    started = time.perf_counter()
    quiet = 0
    while quiet < quiet_s and time.perf_counter() - started < limit_s:
        quiet = quiet + 1 if psutil.cpu_percent(interval=1.0) < idle_percent else 0
    return time.perf_counter() - started


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def write_naive_corpus(store: ObjectStore, prefix: str, rows: int) -> None:
    """Shard tars and indexes shaped like the shard stage's (the video payloads are 4 KiB
    stand-ins: the walk never reads them), for `rows` clips."""
    clips = [(f"ep{i // CLIPS_PER_EPISODE:09d}", i % CLIPS_PER_EPISODE) for i in range(rows)]

    def one(shard: int) -> None:
        chunk = clips[shard * CLIPS_PER_SHARD : (shard + 1) * CLIPS_PER_SHARD]
        members: list[Member] = []
        for episode, clip_index in chunk:
            key = f"{episode}_{clip_index:05d}"
            meta = {
                "clip_key": key,
                "episode_id": episode,
                "device_id": f"dev{int(episode[2:]) % DEVICES:05d}",
                "session_id": f"sess{int(episode[2:]) // EPISODES_PER_SESSION:09d}",
                "clip_index": clip_index,
                "start_s": clip_index * 10.0,
                "duration_s": 10.0,
                "frame_count": 300,
                "codec": "h264",
                "width": 1280,
                "height": 720,
                "fps": 30.0,
                "raw_key": f"raw/x/{episode}.mp4",
                "raw_sha256": "0" * 64,
                "pipeline_version": "v1",
            }
            members += [
                Member(f"{key}.mp4", bytes(4096)),
                Member(f"{key}.json", json.dumps(meta, sort_keys=True).encode()),
            ]
        tar, spans = build_tar(members)
        by_name = {s.name: s for s in spans}
        shard_key = f"{prefix}/{shard:06d}.tar"
        index: dict[str, Any] = {
            "format": "egoline-shard-index",
            "shard_key": shard_key,
            "members": [{"name": s.name, "offset": s.offset, "length": s.length} for s in spans],
            "clips": [
                {
                    "clip_key": f"{e}_{i:05d}",
                    "episode_id": e,
                    "clip_index": i,
                    "mp4_offset": by_name[f"{e}_{i:05d}.mp4"].offset,
                    "mp4_length": by_name[f"{e}_{i:05d}.mp4"].length,
                    "json_offset": by_name[f"{e}_{i:05d}.json"].offset,
                    "json_length": by_name[f"{e}_{i:05d}.json"].length,
                }
                for e, i in chunk
            ],
        }
        store.put_bytes(shard_key, tar, "application/x-tar")
        store.put_bytes(f"{prefix}/{shard:06d}.index.json", json.dumps(index).encode())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(-(-rows // CLIPS_PER_SHARD))))


def naive_walk(store: ObjectStore, prefix: str) -> list[dict[str, Any]]:
    """The file-by-file manifest: list the shard indexes, read each, and read one clip's
    metadata member per episode for the episode's facts (device, session, raw object...)."""
    rows: list[dict[str, Any]] = []
    for key in sorted(store.list_keys(prefix)):
        if not key.endswith(".index.json"):
            continue
        index = json.loads(store.get_bytes(key))
        facts: dict[str, dict[str, Any]] = {}
        for clip in index["clips"]:
            episode = clip["episode_id"]
            if episode not in facts:
                meta = store.get_range(index["shard_key"], clip["json_offset"], clip["json_length"])
                facts[episode] = json.loads(meta)
            rows.append({**facts[episode], **clip, "shard_key": index["shard_key"]})
    rows.sort(key=lambda r: (r["episode_id"], r["clip_index"]))
    return rows


def bench_manifest(
    settings: Settings, rows: int, naive_rows: int, keep: bool, log: Log
) -> dict[str, Any]:
    store = object_store(settings)
    out_dir = Path(tempfile.mkdtemp(prefix="egoline-bench-manifest-"))
    try:
        with bench_database(settings, rows, keep, log) as bench:
            engine = make_engine(bench)
            first_touch = fresh_memory_cost()
            settled_s = settle()
            flt = ManifestFilter(verdicts=[])  # every clip: the timed build returns `rows`
            log("building the manifest")
            built = build_manifest(bench.database_libpq_url, engine, store, flt, out_dir)
            # The same build without the reverse-lineage index, alternating with a rebuild
            # with it (the rebuild's members are COPYed, then rolled back: already indexed).
            bare = build_manifest(
                bench.database_libpq_url, engine, store, flt, out_dir / "3", index=False
            )
            again = build_manifest(bench.database_libpq_url, engine, store, flt, out_dir / "2")
            bare_again = build_manifest(
                bench.database_libpq_url, engine, store, flt, out_dir / "4", index=False
            )
            engine.dispose()
        # The build includes waiting for its members (the COPY overlaps the write; what is
        # left when the file is written is `index_s`).
        build_s = built.query_s + built.explode_s + built.write_s + built.index_s
        unindexed_s = min(b.query_s + b.explode_s + b.write_s for b in (bare, bare_again))
        indexed_s = min(b.query_s + b.explode_s + b.write_s + b.index_s for b in (built, again))

        log("loading it (memory map)")
        rss_before = _rss_mb()
        started = time.perf_counter()
        table = load_manifest(built.local_path)
        load_s = time.perf_counter() - started
        rss_delta = _rss_mb() - rss_before
        started = time.perf_counter()
        total_bytes = pc.sum(table.column("length")).as_py()
        scan_s = time.perf_counter() - started
        assert table.num_rows == built.rows

        log(f"naive: walking {naive_rows:,} rows of shard indexes file by file")
        prefix = f"bench/manifest/{uuid.uuid4().hex}"
        write_naive_corpus(store, prefix, naive_rows)
        started = time.perf_counter()
        walked = naive_walk(store, prefix)
        naive_s = time.perf_counter() - started
        for key in [*store.list_keys(prefix), built.object_key]:
            store.delete(key)
        assert len(walked) == naive_rows
        rows_per_s = built.rows / build_s
        naive_rows_per_s = naive_rows / naive_s
        return {
            "rows": built.rows,
            "episodes": built.rows // CLIPS_PER_EPISODE,
            "build_s": round(build_s, 3),
            "rows_per_s": round(rows_per_s),
            "query_s": round(built.query_s, 3),
            "explode_s": round(built.explode_s, 3),
            "write_s": round(built.write_s, 3),
            "publish_s": round(built.publish_s, 3),
            "file_mb": round(built.size_bytes / 2**20, 1),
            "index_s": round(built.index_s, 3),
            "indexed_episodes": built.indexed.episodes if built.indexed else 0,
            "best_indexed_build_s": round(indexed_s, 3),
            "best_unindexed_build_s": round(unindexed_s, 3),
            "index_cost_fraction": round(indexed_s / unindexed_s - 1, 3),
            "byte_identical_rebuild": again.manifest_id == built.manifest_id == bare.manifest_id,
            "rebuild_s": round(again.query_s + again.explode_s + again.write_s + again.index_s, 3),
            "load_s": round(load_s, 4),
            "rss_delta_mb": round(rss_delta, 1),
            "scan_length_column_s": round(scan_s, 4),
            "clip_bytes_total": total_bytes,
            "vm_first_touch_s_per_gib": round(first_touch, 3),
            "settle_s": round(settled_s, 1),
            "naive_rows": naive_rows,
            "naive_s": round(naive_s, 3),
            "naive_rows_per_s": round(naive_rows_per_s),
            "speedup_vs_naive": round(rows_per_s / naive_rows_per_s, 1),
        }
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
