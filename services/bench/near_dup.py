"""The near-duplicate lookup at corpus scale (the part of `egoline bench curate` that times the
warehouse's banded pHash index, services/metadata/duplicates.py).

1. `seed_signatures`: N episodes of F frame hashes each, straight into `phash_bands` of a
   migrated database by one `generate_series` statement (hashes from md5 of the episode and
   frame number: uniform 64-bit values, the worst case for the index, since real pHashes
   cluster), with the table unlogged and its indexes built after the rows, then VACUUM
   ANALYZE (index-only scans need the visibility map).
2. `time_lookups`: the metadata service's own candidate query (`candidates_sql`) and the rule
   on the candidates' signatures, for fresh signatures: planted near duplicates (a seeded
   episode's hashes with a few bits flipped, trimmed to fewer frames) and new ones; p50/p99
   latency and whether every planted one was found (and no new one matched).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql
from sqlalchemy import create_engine, text

from services.common.settings import Settings
from services.common.stats import rounded_percentile
from services.metadata.duplicates import candidates_sql, is_near_duplicate
from services.metadata.warehouse import upgrade

PIPELINE_VERSION = "bench"

_SEED_SQL = """
INSERT INTO phash_bands (pipeline_version, band, value, phash, episode_id, frame)
SELECT 'bench', b.band, ((h.phash >> (16 * b.band)) & 65535)::int, h.phash, h.episode_id,
       h.frame
FROM (
    SELECT 'nd' || lpad(e::text, 8, '0') AS episode_id, f::smallint AS frame,
           ('x' || substr(md5(e::text || ':' || f::text || ':' || %(salt)s), 1, 16))
               ::bit(64)::bigint AS phash
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS e,
         generate_series(0, %(frames)s::integer - 1) AS f
) h, generate_series(0, 3) AS b(band)
"""
_SIGNATURES_SQL = """
SELECT episode_id, array_agg(phash ORDER BY frame) FROM phash_bands
WHERE band = 0 AND pipeline_version = 'bench' AND episode_id = ANY(%s) GROUP BY episode_id
"""


@dataclass(frozen=True)
class Seeded:
    episodes: int
    frames: int
    band_rows: int
    seed_s: float
    index_s: float
    table_mb: float


def seed_signatures(
    database_url: str, episodes: int = 1_000_000, frames: int = 10, salt: str = "egoline"
) -> Seeded:
    """Seed `episodes` x `frames` hashes (4 band rows each) into a migrated, empty database
    at `database_url` (libpq URL). Slices of 100k episodes, each its own statement, so
    progress is visible and memory flat."""
    started = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE phash_bands SET UNLOGGED")
        conn.execute("DROP INDEX IF EXISTS ix_phash_bands_lookup")
        conn.execute("DROP INDEX IF EXISTS ix_phash_bands_episode")
        conn.execute("SET synchronous_commit = off")
        step = 100_000
        for first in range(1, episodes + 1, step):
            last = min(first + step - 1, episodes)
            conn.execute(_SEED_SQL, {"first": first, "last": last, "frames": frames, "salt": salt})
        seeded = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(
            "CREATE INDEX ix_phash_bands_lookup ON phash_bands "
            "(pipeline_version, band, value) INCLUDE (phash, episode_id)"
        )
        conn.execute(
            "CREATE INDEX ix_phash_bands_episode ON phash_bands (episode_id, pipeline_version)"
        )
        conn.execute("VACUUM ANALYZE phash_bands")
        size = conn.execute("SELECT pg_total_relation_size('phash_bands')").fetchone()
    done = time.perf_counter()
    return Seeded(
        episodes=episodes,
        frames=frames,
        band_rows=episodes * frames * 4,
        seed_s=round(seeded - started, 2),
        index_s=round(done - seeded, 2),
        table_mb=round((size[0] if size else 0) / 2**20, 1),
    )


@dataclass(frozen=True)
class Lookups:
    lookups: int
    planted: int
    planted_found: int
    new_matched: int
    p50_ms: float
    p99_ms: float
    mean_candidates: float
    max_hamming: int
    flipped_bits: int


def _flip(h: int, bits: int, rng: random.Random) -> int:
    """`h` with `bits` random bits flipped, as a signed 64-bit value."""
    h &= (1 << 64) - 1
    for bit in rng.sample(range(64), bits):
        h ^= 1 << bit
    return h - (1 << 64) if h >= 1 << 63 else h


def time_lookups(
    database_url: str,
    episodes: int,
    lookups: int = 200,
    planted_share: float = 0.5,
    flipped_bits: int = 3,
    max_hamming: int = 10,
    min_shared: float = 0.5,
    seed: int = 7,
) -> Lookups:
    """Time `lookups` near-duplicate lookups (index candidates + the rule on their
    signatures) against a seeded database; half are planted near duplicates."""
    rng = random.Random(seed)
    planted_ids = [
        f"nd{rng.randint(1, episodes):08d}" for _ in range(round(lookups * planted_share))
    ]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(_SIGNATURES_SQL, (planted_ids,)).fetchall()
    signatures = {str(e): [int(h) for h in hashes] for e, hashes in rows}
    queries: list[tuple[str | None, list[int]]] = []
    for target in planted_ids:
        hashes = signatures[target]
        trimmed = hashes[1 : max(len(hashes) - 2, 2)]  # a trimmed copy: fewer frames
        queries.append((target, [_flip(h, flipped_bits, rng) for h in trimmed]))
    while len(queries) < lookups:
        queries.append((None, [_flip(rng.getrandbits(64), 0, rng) for _ in range(8)]))
    rng.shuffle(queries)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    latencies: list[float] = []
    candidates: list[int] = []
    found = false_matches = 0
    try:
        with engine.connect() as conn:
            for planted_id, hashes in queries:
                started = time.perf_counter()
                stmt = candidates_sql("query", PIPELINE_VERSION, hashes, max_hamming)
                ids = sorted(str(r[0]) for r in conn.execute(stmt))
                theirs = conn.execute(
                    text(_SIGNATURES_SQL.replace("%s", ":ids")), {"ids": ids}
                ).fetchall()
                matches = {
                    str(e)
                    for e, sig in theirs
                    if is_near_duplicate(hashes, [int(h) for h in sig], max_hamming, min_shared)
                }
                latencies.append((time.perf_counter() - started) * 1000)
                candidates.append(len(ids))
                if planted_id is not None and planted_id in matches:
                    found += 1
                if planted_id is None and matches:
                    false_matches += 1
    finally:
        engine.dispose()
    latencies.sort()
    return Lookups(
        lookups=len(queries),
        planted=len(planted_ids),
        planted_found=found,
        new_matched=false_matches,
        p50_ms=rounded_percentile(latencies, 50, 2),
        p99_ms=rounded_percentile(latencies, 99, 2),
        mean_candidates=round(statistics.fmean(candidates), 1),
        max_hamming=max_hamming,
        flipped_bits=flipped_bits,
    )


@contextlib.contextmanager
def bench_database(settings: Settings) -> Iterator[str]:
    """A fresh migrated database beside the warehouse (libpq URL); dropped afterwards."""
    base, _, _ = settings.database_libpq_url.rpartition("/")
    name = f"bench_near_dup_{uuid.uuid4().hex[:8]}"
    admin = f"{base}/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        upgrade(settings.model_copy(update={"database_url": f"{base}/{name}"}))
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


def near_dup_lookup_bench(
    settings: Settings, episodes: int = 1_000_000, frames: int = 10, lookups: int = 200
) -> dict[str, object]:
    """Seed, time the lookups, drop: the figures as one JSON-ready dict."""
    with bench_database(settings) as url:
        seeded = seed_signatures(url, episodes, frames)
        timed = time_lookups(
            url,
            episodes,
            lookups,
            max_hamming=settings.curation.near_dup_max_hamming,
            min_shared=settings.curation.near_dup_min_shared,
        )
    return {"near_dup_lookup": {**asdict(seeded), **asdict(timed)}}
