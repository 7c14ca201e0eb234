"""`egoline bench used-by`: `lineage --episode ID --used-by` at scale (docs/warehouse.md
"Reverse lineage").

On the configured Postgres (the embedded stack by default), in the `bench manifest` database
(`<db>_bench_manifest`, seeded the same way, kept between runs with `--keep`):
1. seed `episodes` episodes of 10 clips (`services/bench/manifest.py`'s bulk load), not timed;
2. build one real manifest with `build_manifest` (its members COPYed while the file is
   written: `index_s` is what the build waited for them);
3. index `manifests - 1` more through the same `MemberCopy` path (COPY into a fresh partition,
   sorted CREATE INDEX, attach, the `manifests` and `indexed_manifests` rows), each holding a
   seeded random `share` of the episodes, and register one training run per manifest;
4. time `used_by` (the function behind the command) for `lookups` random episodes on one
   connection pool, and check each answer against the seeded membership;
5. time `manifest check` of the last manifest against the other `manifests - 1`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
from sqlalchemy import Engine

from services.bench.manifest import CLIPS_PER_EPISODE, Log, bench_database
from services.common.objectstore import object_store
from services.common.settings import Settings
from services.common.stats import rounded_percentile
from services.manifest.build import build_manifest
from services.manifest.check import check_heldout
from services.manifest.index import IndexFacts, ManifestRecord, MemberCopy, partition_name
from services.manifest.members import clip_bitmaps
from services.manifest.query import ManifestFilter
from services.manifest.runs import register_run, used_by
from services.metadata.warehouse import make_engine

FAMILY = "bench-used-by"


def forget_lineage(settings: Settings) -> None:
    """Drop what an earlier run of this benchmark indexed in a kept database."""
    with psycopg.connect(settings.database_libpq_url, autocommit=True) as conn:
        for (number,) in conn.execute("SELECT manifest_no FROM indexed_manifests").fetchall():
            conn.execute(f"DROP TABLE IF EXISTS {partition_name(number)}")
        conn.execute("DELETE FROM training_runs")
        conn.execute("DELETE FROM indexed_manifests")
        conn.execute("DELETE FROM manifests")


def _episodes(settings: Settings) -> pa.Table:
    with psycopg.connect(settings.database_libpq_url) as conn:
        rows = conn.execute("SELECT episode_id, split FROM episodes ORDER BY episode_id").fetchall()
    return pa.table({"episode_id": [r[0] for r in rows], "split": [r[1] for r in rows]})


def _given(members: pa.Table) -> Callable[[], pa.Table]:
    return lambda: members


def bench_used_by(
    settings: Settings,
    episodes: int,
    manifests: int,
    share: float,
    lookups: int,
    keep: bool,
    log: Log,
    seed: int = 19,
) -> dict[str, Any]:
    out_dir = Path(tempfile.mkdtemp(prefix="egoline-bench-used-by-"))
    try:
        with bench_database(settings, episodes * CLIPS_PER_EPISODE, keep, log) as bench:
            forget_lineage(bench)
            engine = make_engine(bench)
            store = object_store(bench)
            log("building one manifest for real (members COPYed during the write)")
            built = build_manifest(
                bench.database_libpq_url,
                engine,
                store,
                ManifestFilter(verdicts=[]),
                out_dir,
                family=FAMILY,
            )
            store.delete(built.object_key)
            try:
                figures = time_used_by(
                    bench, engine, [built.manifest_id], manifests, share, lookups, log, seed
                )
            finally:
                engine.dispose()
        return {
            "build_s": round(built.query_s + built.explode_s + built.write_s, 3),
            "build_index_s": round(built.index_s, 3),
            **figures,
        }
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def time_used_by(
    bench: Settings,
    engine: Engine,
    built_ids: list[str],
    manifests: int,
    share: float,
    lookups: int,
    log: Log,
    seed: int = 19,
) -> dict[str, Any]:
    """On a seeded warehouse where `built_ids` are manifests already built (and indexed) over
    every episode: index `manifests - len(built_ids)` more, each holding a random `share` of
    the episodes, register one run per manifest, time `used_by` for `lookups` random episodes
    (each answer checked against the membership) and `manifest check` of the last manifest."""
    rng = np.random.default_rng(seed)
    for k, manifest_id in enumerate(built_ids):
        register_run(engine, f"bench-run-{k:04d}", manifest_id)
    every = _episodes(bench)
    count = every.num_rows
    holds = np.ones((manifests, count), dtype=bool)
    full = clip_bitmaps(
        np.repeat(np.arange(count), CLIPS_PER_EPISODE),
        np.tile(np.arange(CLIPS_PER_EPISODE), count),
        count,
    )
    members = every.append_column("clips", full)
    ids = list(built_ids)
    started = time.perf_counter()
    for k in range(len(built_ids), manifests):
        holds[k] = rng.random(count) < share
        part = members.filter(pa.array(holds[k]))
        manifest_id = hashlib.sha256(f"bench-used-by-{seed}-{k}".encode()).hexdigest()
        record = ManifestRecord(
            manifest_id,
            f"manifests/{manifest_id}.arrow",
            "-- seeded by bench used-by",
            [],
            part.num_rows * CLIPS_PER_EPISODE,
            0,
        )
        facts = IndexFacts(FAMILY, "v1", {"calibration": f"v{k}"}, "build")
        MemberCopy(bench.database_libpq_url, _given(part)).commit(record, facts)
        register_run(engine, f"bench-run-{k:04d}", manifest_id, note="seeded")
        ids.append(manifest_id)
        if k % 10 == 0 or k == manifests - 1:
            log(f"indexed {k + 1}/{manifests} manifests")
    index_all_s = time.perf_counter() - started
    with psycopg.connect(bench.database_libpq_url, autocommit=True) as conn:
        conn.execute("ANALYZE manifest_members")
        found = conn.execute(
            "SELECT count(*), sum(pg_total_relation_size(relid)) "
            "FROM pg_partition_tree('manifest_members') WHERE isleaf"
        ).fetchone()
        member_rows = conn.execute("SELECT count(*) FROM manifest_members").fetchone()
    assert found is not None and member_rows is not None
    log(f"timing used-by for {lookups:,} random episodes")
    picks = rng.integers(0, count, size=lookups)
    names = every.column("episode_id").to_pylist()
    timings: list[float] = []
    wrong = 0
    used_by(engine, names[0])  # the pool's connection, opened outside the timing
    for pick in picks:
        begun = time.perf_counter()
        uses, runs = used_by(engine, names[int(pick)])
        timings.append((time.perf_counter() - begun) * 1000)
        expected = {ids[k] for k in np.flatnonzero(holds[:, int(pick)])}
        if {u.manifest_id for u in uses} != expected or len(runs) != len(expected):
            wrong += 1
    log("checking the last manifest's held-out integrity against the family")
    begun = time.perf_counter()
    report = check_heldout(engine, ids[-1], "session")
    check_s = time.perf_counter() - begun
    return {
        "episodes": count,
        "manifests": manifests,
        "share": share,
        "member_rows": int(member_rows[0]),
        "partitions": int(found[0]),
        "index_mb": round(int(found[1] or 0) / 2**20, 1),
        "index_s_per_manifest": round(index_all_s / max(manifests - 1, 1), 3),
        "lookups": lookups,
        "wrong_answers": wrong,
        "mean_manifests_per_episode": round(float(holds.sum(axis=0).mean()), 1),
        "used_by_p50_ms": rounded_percentile(timings, 50, 3),
        "used_by_p99_ms": rounded_percentile(timings, 99, 3),
        "used_by_max_ms": round(max(timings), 3),
        "check_s": round(check_s, 3),
        "check_ok": report.ok,  # with share 1.0 every manifest holds the same episodes
    }
