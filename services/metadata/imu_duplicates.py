"""Near duplicates by IMU signature: the SQL that stores an episode's signature and landmarks
and finds the episodes whose IMU trace is the same recording (pure: statements, no I/O).

The signature, its landmarks and the rule are `services/sensors/imu_signature.py`; this is the
same alignment and check run in Postgres over the landmark index, in the metadata service's
savepoint for the episode's `episodes.validated` (the signature rides in its `decoded`):

1. **Candidates**: every stored landmark with one of our hashes (`imu_landmarks`, a btree on
   (pipeline version, hash) carrying the anchor time and episode: an index-only lookup per
   hash), each a vote for a lag (their anchor time minus ours); per episode, the median lag,
   and the votes within `LAG_TOLERANCE_S` of it (at least `min_votes`, or one when either
   signature has fewer than `FEW_LANDMARKS` landmarks: `votes_needed`).
2. **The check**: Pearson correlation (`corr`) of the two stored descriptors over their overlap
   at that lag, one grid step either side, the best of the three.
3. **The rule**: correlation >= `min_correlation` over an overlap of at least `min_overlap_s`
   covering at least `min_cover` of the shorter trace. The pair is stored once, the later
   episode (started_at, then id) naming the earlier, whatever order the events came in; the
   evidence (votes; `lag_s`, the earlier episode's clock minus the later's at one moment: a
   copy trimmed by T s has lag T; correlation; overlap) is rounded so either order stores the
   same numbers.

An uninformative signature (no landmarks: a device at rest) is stored but has no landmarks,
so it neither finds nor is found. An episode without an IMU has no signature.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BindParameter, Executable, TextClause, bindparam, delete, text
from sqlalchemy.dialects.postgresql import ARRAY, BIGINT, DOUBLE_PRECISION, insert

from schemas.events import ImuSignature
from services.metadata.warehouse import imu_duplicates, imu_landmarks, imu_signatures
from services.sensors.imu_signature import FEW_LANDMARKS, LAG_TOLERANCE_S, ImuRule


def imu_signature_statements(
    episode_id: str, pipeline_version: str, signature: ImuSignature | None, rule: ImuRule
) -> list[Executable]:
    """Forget the episode's signature, landmarks and IMU pairs, then store its signature and
    landmarks and every pair it forms with a stored episode (the same rows on a replay)."""
    forget: list[Executable] = [
        delete(imu_duplicates).where(
            imu_duplicates.c.pipeline_version == pipeline_version,
            (imu_duplicates.c.episode_id == episode_id)
            | (imu_duplicates.c.duplicate_of == episode_id),
        ),
        delete(imu_landmarks).where(
            imu_landmarks.c.episode_id == episode_id,
            imu_landmarks.c.pipeline_version == pipeline_version,
        ),
        delete(imu_signatures).where(
            imu_signatures.c.episode_id == episode_id,
            imu_signatures.c.pipeline_version == pipeline_version,
        ),
    ]
    if signature is None:
        return forget
    row = insert(imu_signatures).values(
        episode_id=episode_id,
        pipeline_version=pipeline_version,
        signature_version=signature.version,
        rate_hz=signature.rate_hz,
        start_s=signature.start_s,
        span_s=len(signature.values) / signature.rate_hz,
        peaks=signature.peaks,
        landmarks=len(signature.landmarks),
        gyro=signature.values,
    )
    if not signature.landmarks:
        return [*forget, row]
    return [
        *forget,
        row,
        _landmarks_sql(episode_id, pipeline_version, signature),
        find_imu_duplicates_sql(episode_id, pipeline_version, signature, rule),
    ]


_LANDMARKS_SQL = """
INSERT INTO imu_landmarks (pipeline_version, hash, t_s, episode_id)
SELECT :pipeline_version, l.hash, l.t_s, :episode_id
FROM unnest(CAST(:hashes AS bigint[]), CAST(:times AS float8[])) AS l(hash, t_s)
"""


def _landmarks_sql(episode_id: str, pipeline_version: str, signature: ImuSignature) -> TextClause:
    return text(_LANDMARKS_SQL).bindparams(
        *_landmark_params(episode_id, pipeline_version, signature)
    )


def _landmark_params(
    episode_id: str, pipeline_version: str, signature: ImuSignature
) -> list[BindParameter[Any]]:
    return [
        bindparam("pipeline_version", value=pipeline_version),
        bindparam("episode_id", value=episode_id),
        bindparam("hashes", value=list(signature.landmarks), type_=ARRAY(BIGINT)),
        bindparam("times", value=list(signature.landmark_t_s), type_=ARRAY(DOUBLE_PRECISION)),
    ]


# The index lookup alone (the bench times it too): episodes sharing at least one landmark
# hash with ours, the median lag (their anchor time minus ours, seconds) and the votes within
# the tolerance of it, with their landmark count (the votes needed depend on it).
CANDIDATES_SQL = """
WITH q AS (
    SELECT h.hash, h.t_s
    FROM unnest(CAST(:hashes AS bigint[]), CAST(:times AS float8[])) AS h(hash, t_s)
), hit AS (
    SELECT l.episode_id, l.t_s - q.t_s AS lag_s
    FROM q JOIN imu_landmarks l ON l.pipeline_version = :pipeline_version AND l.hash = q.hash
    WHERE l.episode_id <> :episode_id
), centre AS (
    SELECT episode_id, percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_s) AS lag_s
    FROM hit GROUP BY episode_id
)
SELECT c.episode_id, c.lag_s, count(*) AS votes, s.landmarks
FROM centre c JOIN hit h ON h.episode_id = c.episode_id
     AND abs(h.lag_s - c.lag_s) <= :lag_tolerance
JOIN imu_signatures s ON s.episode_id = c.episode_id
     AND s.pipeline_version = :pipeline_version
GROUP BY c.episode_id, c.lag_s, s.landmarks
HAVING count(*) >= CASE WHEN least(s.landmarks, cardinality(CAST(:hashes AS bigint[])))
                             < :few_landmarks THEN 1 ELSE :min_votes END
"""

_FIND_TEMPLATE = """
WITH voted AS ({candidates}),
me AS (
    SELECT e.episode_id, e.started_at, s.rate_hz, s.start_s, s.span_s, s.gyro
    FROM episodes e JOIN imu_signatures s ON s.episode_id = e.episode_id
         AND s.pipeline_version = :pipeline_version
    WHERE e.episode_id = :episode_id
), scored AS (
    SELECT v.episode_id AS other_id, o.started_at AS other_started, v.votes, v.lag_s,
           best.r AS correlation, best.n / me.rate_hz AS overlap_s,
           least(me.span_s, os.span_s) AS shorter_s
    FROM voted v
    CROSS JOIN me
    JOIN episodes o ON o.episode_id = v.episode_id
    JOIN imu_signatures os ON os.episode_id = v.episode_id
         AND os.pipeline_version = :pipeline_version AND os.rate_hz = me.rate_hz
    CROSS JOIN LATERAL (
        SELECT c.r, c.n
        FROM generate_series(-1, 1) AS d(step)
        CROSS JOIN LATERAL (
            SELECT corr(a.x, b.x) AS r, count(*) AS n
            FROM unnest(me.gyro) WITH ORDINALITY AS a(x, i)
            JOIN unnest(os.gyro) WITH ORDINALITY AS b(x, j)
              ON b.j = a.i + round((me.start_s + v.lag_s - os.start_s) * me.rate_hz)::int
                       + d.step
        ) c
        ORDER BY c.r DESC NULLS LAST, abs(d.step)
        LIMIT 1
    ) best
)
INSERT INTO imu_duplicates
    (pipeline_version, episode_id, duplicate_of, votes, lag_s, correlation, overlap_s)
SELECT :pipeline_version,
       CASE WHEN o.me_first THEN s.other_id ELSE me.episode_id END,
       CASE WHEN o.me_first THEN me.episode_id ELSE s.other_id END,
       s.votes,
       round((CASE WHEN o.me_first THEN -s.lag_s ELSE s.lag_s END)::numeric, 3)::float8,
       round(s.correlation::numeric, 4)::float8,
       round(s.overlap_s::numeric, 3)::float8
FROM scored s CROSS JOIN me
CROSS JOIN LATERAL (
    SELECT (me.started_at, me.episode_id) < (s.other_started, s.other_id) AS me_first
) o
WHERE s.correlation >= :min_correlation
  AND s.overlap_s >= greatest(:min_overlap_s, :min_cover * s.shorter_s)
ON CONFLICT (pipeline_version, episode_id, duplicate_of) DO UPDATE
SET votes = excluded.votes, lag_s = excluded.lag_s, correlation = excluded.correlation,
    overlap_s = excluded.overlap_s
"""
# Only the constant candidates query is formatted in; every value is a bound parameter.
_FIND_SQL = _FIND_TEMPLATE.format(candidates=CANDIDATES_SQL)


def candidates_sql(
    episode_id: str, pipeline_version: str, signature: ImuSignature, min_votes: int
) -> TextClause:
    """Episodes sharing enough landmarks with the signature at one lag (the lookup alone)."""
    return text(CANDIDATES_SQL).bindparams(
        *_landmark_params(episode_id, pipeline_version, signature),
        bindparam("min_votes", value=min_votes),
        bindparam("few_landmarks", value=FEW_LANDMARKS),
        bindparam("lag_tolerance", value=LAG_TOLERANCE_S),
    )


def find_imu_duplicates_sql(
    episode_id: str, pipeline_version: str, signature: ImuSignature, rule: ImuRule
) -> TextClause:
    """Store every pair the episode (its signature already stored) forms with another."""
    return text(_FIND_SQL).bindparams(
        *_landmark_params(episode_id, pipeline_version, signature),
        bindparam("min_votes", value=rule.min_votes),
        bindparam("few_landmarks", value=FEW_LANDMARKS),
        bindparam("lag_tolerance", value=LAG_TOLERANCE_S),
        bindparam("min_correlation", value=rule.min_correlation),
        bindparam("min_overlap_s", value=rule.min_overlap_s),
        bindparam("min_cover", value=rule.min_cover),
    )
