"""The IMU near-duplicate lookup at corpus scale (the IMU half of the near-duplicate part of
`egoline bench curate`: the warehouse's landmark index, services/metadata/imu_duplicates.py).

1. `seed_imu_signatures`: N recordings of `RECORDING_S` (30 s) of synthetic hand-held motion
   (`scene.hand_held_gyro`: sway and head turns, each seed its own; MEMS noise), their real
   signatures (~47 landmarks each) COPYed into `imu_landmarks` and `imu_signatures` of a
   migrated database, the tables unlogged and the lookup index built after the rows, then
   VACUUM ANALYZE. Real landmarks, not uniform random hashes: the motion model's peak heights
   and gaps are far from uniform, so some landmarks are commoner than others.
2. `time_imu_lookups`: the metadata service's own statements for an episode's IMU signature
   (store it and its landmarks, find its pairs: index lookup, lag vote and the correlation in
   SQL; `imu_signature_statements`), one transaction per episode rolled back after, for
   trimmed copies of planted recordings and new recordings; p50/p99 latency, planted found,
   new ones matched, and the index lookup alone (`candidates_sql`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
from sqlalchemy import Connection, create_engine, text

from schemas.events import ImuSignature
from services.bench.near_dup import bench_database
from services.common.settings import Settings
from services.common.stats import rounded_percentile
from services.decode.core import signature_model
from services.metadata.imu_duplicates import candidates_sql, imu_signature_statements
from services.sensors.imu_signature import ImuDescriptor, ImuRule, describe_gyro
from services.synth.scene import hand_held_gyro

PIPELINE_VERSION = "bench"
RECORDING_S = 30.0

_SEED_EPISODES_SQL = """
INSERT INTO episodes (episode_id, device_id, session_id, started_at, split, status, status_rank)
SELECT 'imu' || lpad(e::text, 8, '0'), 'bench-device', 'bench', '2026-01-01'::timestamptz
       + e * interval '1 minute', 'train', 'validated', 3
FROM generate_series(0, %(episodes)s::bigint - 1) AS e
"""
_EPISODE_SQL = """
INSERT INTO episodes (episode_id, device_id, session_id, started_at, split, status, status_rank)
VALUES (:episode_id, 'bench-device', 'bench', :started_at, 'train', 'validated', 3)
"""
_PAIRS_SQL = """
SELECT episode_id, duplicate_of FROM imu_duplicates
WHERE pipeline_version = 'bench' AND (episode_id = :episode_id OR duplicate_of = :episode_id)
"""


def recording(seed: int, duration_s: float = RECORDING_S, trim_s: float = 0.0) -> ImuDescriptor:
    """The signature of a hand-held recording (synth's motion model at 100 Hz plus MEMS noise),
    trimmed by `trim_s` and rebased as a trimmed copy is."""
    t = np.arange(0.0, duration_s, 0.01)
    gyro = hand_held_gyro(t, seed) + np.random.default_rng(seed).normal(0, 0.01, (t.size, 3))
    keep = t >= trim_s
    return describe_gyro(t[keep] - trim_s, gyro[keep])


@dataclass(frozen=True)
class SeededImu:
    episodes: int
    recording_s: float
    landmark_rows: int
    distinct_landmarks: int
    describe_s: float
    seed_s: float
    index_s: float
    table_mb: float


def seed_imu_signatures(database_url: str, episodes: int, chunk: int = 5_000) -> SeededImu:
    """Describe `episodes` synthetic recordings and COPY their signatures and landmarks into a
    migrated, empty database (libpq URL), `chunk` recordings at a time."""
    describe_s = copy_s = 0.0
    rows = 0
    distinct: set[int] = set()
    with psycopg.connect(database_url, autocommit=True) as conn:
        # The episodes the signatures belong to (the pair search reads their start times).
        conn.execute("INSERT INTO devices (device_id) VALUES ('bench-device')")
        conn.execute(_SEED_EPISODES_SQL, {"episodes": episodes})
        conn.execute("ALTER TABLE imu_landmarks SET UNLOGGED")
        conn.execute("ALTER TABLE imu_signatures SET UNLOGGED")
        conn.execute("DROP INDEX IF EXISTS ix_imu_landmarks_lookup")
        conn.execute("DROP INDEX IF EXISTS ix_imu_landmarks_episode")
        conn.execute("SET synchronous_commit = off")
        for first in range(0, episodes, chunk):
            started = time.perf_counter()
            batch = [
                (f"imu{e:08d}", recording(e)) for e in range(first, min(episodes, first + chunk))
            ]
            described = time.perf_counter()
            with conn.cursor() as cur:
                with cur.copy(
                    "COPY imu_landmarks (pipeline_version, hash, t_s, episode_id) FROM STDIN"
                ) as copy:
                    for episode_id, d in batch:
                        for h, t in zip(d.landmarks, d.landmark_t_s, strict=True):
                            copy.write_row((PIPELINE_VERSION, h, t, episode_id))
                        rows += len(d.landmarks)
                        distinct.update(d.landmarks)
                with cur.copy(
                    "COPY imu_signatures (episode_id, pipeline_version, signature_version, "
                    "rate_hz, start_s, span_s, peaks, landmarks, gyro) FROM STDIN"
                ) as copy:
                    for episode_id, d in batch:
                        copy.write_row(
                            (episode_id, PIPELINE_VERSION, 1, d.rate_hz, d.start_s, d.span_s,
                             d.peaks, len(d.landmarks), list(d.values))
                        )  # fmt: skip
            describe_s += described - started
            copy_s += time.perf_counter() - described
        indexing = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '512MB'")
        conn.execute(
            "CREATE INDEX ix_imu_landmarks_lookup ON imu_landmarks "
            "(pipeline_version, hash) INCLUDE (t_s, episode_id)"
        )
        conn.execute(
            "CREATE INDEX ix_imu_landmarks_episode ON imu_landmarks (episode_id, pipeline_version)"
        )
        conn.execute("VACUUM ANALYZE imu_landmarks")
        conn.execute("VACUUM ANALYZE imu_signatures")
        size = conn.execute(
            "SELECT pg_total_relation_size('imu_landmarks')"
            " + pg_total_relation_size('imu_signatures')"
        ).fetchone()
    return SeededImu(
        episodes=episodes,
        recording_s=RECORDING_S,
        landmark_rows=rows,
        distinct_landmarks=len(distinct),
        describe_s=round(describe_s, 2),
        seed_s=round(copy_s, 2),
        index_s=round(time.perf_counter() - indexing, 2),
        table_mb=round((size[0] if size else 0) / 2**20, 1),
    )


@dataclass(frozen=True)
class ImuLookups:
    lookups: int
    planted: int
    planted_found: int
    new_matched: int
    p50_ms: float
    p99_ms: float
    index_p50_ms: float
    mean_candidates: float
    mean_query_landmarks: float


def _store(
    conn: Connection, episode_id: str, started_at: datetime, sig: ImuSignature, rule: ImuRule
) -> None:
    """What the metadata service runs for one validated episode's IMU signature."""
    conn.execute(text(_EPISODE_SQL), {"episode_id": episode_id, "started_at": started_at})
    for statement in imu_signature_statements(episode_id, PIPELINE_VERSION, sig, rule):
        conn.execute(statement)


def time_imu_lookups(
    database_url: str, lookups: int = 200, rule: ImuRule | None = None
) -> ImuLookups:
    """Time `lookups` episodes going through the metadata service's own IMU statements (store
    the signature and landmarks, find the pairs: index lookup, lag vote, correlation in SQL),
    each in a transaction rolled back afterwards; half are trimmed copies of planted
    recordings (stored first the same way). The index lookup alone is timed too."""
    rule = rule or ImuRule()
    planted_seeds = list(range(5_000_000, 5_000_000 + lookups // 2))
    late = datetime(2030, 1, 1, tzinfo=UTC)
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    queries: list[tuple[str | None, ImuSignature]] = [
        (f"planted{s}", signature_model(recording(s, trim_s=2.0 + (s % 9) * 0.37)))
        for s in planted_seeds
    ]
    queries += [
        (None, signature_model(recording(s)))
        for s in range(6_000_000, 6_000_000 + lookups - len(queries))
    ]
    latencies: list[float] = []
    index_ms: list[float] = []
    candidates: list[int] = []
    found = false_matches = 0
    try:
        with engine.begin() as conn:
            for s in planted_seeds:
                _store(conn, f"planted{s}", late, signature_model(recording(s)), rule)
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE imu_landmarks")
            conn.commit()
            for i, (planted_id, sig) in enumerate(queries):
                query_id = f"query{i:05d}"
                started = time.perf_counter()
                voted = conn.execute(
                    candidates_sql(query_id, PIPELINE_VERSION, sig, rule.min_votes)
                ).fetchall()
                index_ms.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                _store(conn, query_id, late + timedelta(minutes=1 + i), sig, rule)
                latencies.append((time.perf_counter() - started) * 1000)
                pairs = conn.execute(text(_PAIRS_SQL), {"episode_id": query_id}).fetchall()
                conn.rollback()
                matches = {str(b) for _, b in pairs}
                candidates.append(len(voted))
                if planted_id is not None and planted_id in matches:
                    found += 1
                if matches - {planted_id}:
                    false_matches += 1
    finally:
        engine.dispose()
    latencies.sort()
    return ImuLookups(
        lookups=len(queries),
        planted=len(planted_seeds),
        planted_found=found,
        new_matched=false_matches,
        p50_ms=rounded_percentile(latencies, 50, 2),
        p99_ms=rounded_percentile(latencies, 99, 2),
        index_p50_ms=rounded_percentile(index_ms, 50, 2),
        mean_candidates=round(statistics.fmean(candidates), 1),
        mean_query_landmarks=round(statistics.fmean(len(s.landmarks) for _, s in queries), 1),
    )


def imu_dup_lookup_bench(
    settings: Settings, episodes: int = 100_000, lookups: int = 200
) -> dict[str, object]:
    """Seed, time the lookups, drop: the figures as one JSON-ready dict."""
    rule = ImuRule(
        min_votes=settings.curation.imu_dup_min_votes,
        min_correlation=settings.curation.imu_dup_min_correlation,
        min_overlap_s=settings.curation.imu_dup_min_overlap_s,
        min_cover=settings.curation.imu_dup_min_cover,
    )
    with bench_database(settings) as url:
        seeded = seed_imu_signatures(url, episodes)
        timed = time_imu_lookups(url, lookups, rule)
    return {"imu_dup_lookup": {**asdict(seeded), **asdict(timed)}}
