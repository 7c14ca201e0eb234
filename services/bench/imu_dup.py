"""The IMU near-duplicate lookup at corpus scale (the IMU half of the near-duplicate part of
`egoline bench curate`: the warehouse's landmark index, services/metadata/imu_duplicates.py).

1. `seed_imu_signatures`: N recordings of `RECORDING_S` (30 s) of synthetic hand-held motion
   (`scene.hand_held_gyro`: sway and head turns, each seed its own; MEMS noise), their real
   signatures (~47 landmarks each) COPYed into `imu_landmarks` and `imu_signatures` of a
   migrated database, the tables unlogged and the lookup index built after the rows, then
   VACUUM ANALYZE. Real landmarks, not uniform random hashes: the motion model's peak heights
   and gaps are far from uniform, so some landmarks are commoner than others.
2. `time_imu_lookups`: the metadata service's own candidate query (`candidates_sql`: index
   lookup and lag vote) and the correlation check on the candidates' descriptors, for fresh
   signatures: trimmed copies of planted recordings (stored with their real landmarks) and
   new recordings; p50/p99 latency, planted found, new ones matched.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import psycopg
from sqlalchemy import create_engine, text

from schemas.events import ImuSignature
from services.bench.near_dup import bench_database
from services.common.settings import Settings
from services.decode.core import signature_model
from services.metadata.imu_duplicates import candidates_sql
from services.sensors.imu_signature import ImuDescriptor, ImuRule, confirm_match, describe_gyro
from services.synth.scene import hand_held_gyro

PIPELINE_VERSION = "bench"
RECORDING_S = 30.0

_DESCRIPTORS_SQL = """
SELECT episode_id, start_s, gyro FROM imu_signatures
WHERE pipeline_version = 'bench' AND episode_id = ANY(:ids)
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
        # A throwaway database: no episodes rows behind the signatures.
        conn.execute(
            "ALTER TABLE imu_signatures DROP CONSTRAINT IF EXISTS imu_signatures_episode_id_fkey"
        )
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


def _plant(database_url: str, planted: dict[str, ImuDescriptor]) -> None:
    """Store the planted recordings as the metadata service would (real landmarks)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for episode_id, d in planted.items():
            conn.execute(
                "INSERT INTO imu_signatures VALUES (%s, 'bench', 1, %s, %s, %s, %s, %s, %s)",
                (episode_id, d.rate_hz, d.start_s, d.span_s, d.peaks, len(d.landmarks),
                 list(d.values)),
            )  # fmt: skip
            conn.execute(
                "INSERT INTO imu_landmarks SELECT 'bench', h, t, %s "
                "FROM unnest(%s::bigint[], %s::float8[]) AS l(h, t)",
                (episode_id, list(d.landmarks), list(d.landmark_t_s)),
            )
        conn.execute("ANALYZE imu_landmarks")


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


def time_imu_lookups(
    database_url: str, lookups: int = 200, rule: ImuRule | None = None
) -> ImuLookups:
    """Time `lookups` IMU lookups (index candidates with their lag vote, then the correlation
    check on the candidates' descriptors); half are trimmed copies of planted recordings."""
    rule = rule or ImuRule()
    planted_seeds = list(range(5_000_000, 5_000_000 + lookups // 2))
    planted = {f"planted{s}": recording(s) for s in planted_seeds}
    _plant(database_url, planted)
    queries: list[tuple[str | None, ImuSignature]] = [
        (f"planted{s}", signature_model(recording(s, trim_s=2.0 + (s % 9) * 0.37)))
        for s in planted_seeds
    ]
    queries += [
        (None, signature_model(recording(s)))
        for s in range(6_000_000, 6_000_000 + lookups - len(queries))
    ]
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    latencies: list[float] = []
    index_ms: list[float] = []
    candidates: list[int] = []
    found = false_matches = 0
    try:
        with engine.connect() as conn:
            for planted_id, sig in queries:
                ours = ImuDescriptor(
                    sig.rate_hz, sig.start_s, tuple(sig.values), sig.peaks,
                    tuple(sig.landmarks), tuple(sig.landmark_t_s),
                )  # fmt: skip
                started = time.perf_counter()
                voted = conn.execute(
                    candidates_sql("query", PIPELINE_VERSION, sig, rule.min_votes)
                ).fetchall()
                looked_up = time.perf_counter()
                votes = {str(e): (float(lag), int(n)) for e, lag, n in voted}
                rows = conn.execute(text(_DESCRIPTORS_SQL), {"ids": sorted(votes)}).fetchall()
                matches = set()
                for episode_id, start_s, gyro in rows:
                    theirs = ImuDescriptor(10.0, float(start_s), tuple(gyro), 0, (), ())
                    lag, n = votes[str(episode_id)]
                    if confirm_match(ours, theirs, n, lag, rule) is not None:
                        matches.add(str(episode_id))
                latencies.append((time.perf_counter() - started) * 1000)
                index_ms.append((looked_up - started) * 1000)
                candidates.append(len(votes))
                if planted_id is not None and planted_id in matches:
                    found += 1
                if (planted_id is None and matches) or (matches - {planted_id}):
                    false_matches += 1
    finally:
        engine.dispose()
    latencies.sort()
    return ImuLookups(
        lookups=len(queries),
        planted=len(planted_seeds),
        planted_found=found,
        new_matched=false_matches,
        p50_ms=round(statistics.median(latencies), 2),
        p99_ms=round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        index_p50_ms=round(statistics.median(index_ms), 2),
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
