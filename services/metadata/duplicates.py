"""Near duplicates by perceptual hash (pure): the banded index, Hamming distance, the episode
rule, and the SQL that stores an episode's hashes and finds its near duplicates.

An episode's signature is the 64-bit pHash of each sampled frame (`StreamSignals.phash`), minus
uniform frames (luma std below `UNIFORM_STD`: black, covered lens, a flat wall), whose hashes
are all alike and would make every covered-lens episode match every other.

The index is multi-index hashing (Norouzi, Punjani, Fleet 2012): each hash is cut into
`BANDS` bands of `BAND_BITS` bits, one row per (band, value) in `phash_bands` with a btree on
(pipeline version, band, value) that also carries the full hash. If two hashes differ in at
most r bits, the r bits fall into 4 bands, so some band differs in at most floor(r / 4) bits
(pigeonhole): probing, in every band, each value within that radius of the query's (137 values
of 16 bits for r = 10: 1 + 16 + 120) finds every hash within r, with no false negatives; the
full hash in the index checks `bit_count((a # b)::bit(64)) <= r` without a heap visit.
docs/warehouse.md says why 4 bands and what a lookup costs.

The rule: B is a near duplicate of A when at least `min_shared` of the shorter signature's
hashes have a hash of the other within `max_hamming` bits (`shared_fraction`). It is symmetric,
so whichever of the two is stored second finds the pair; the later one (by `started_at`, then
episode id) names the earlier as its `duplicate_of`, whatever order the events came in.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, Executable, TextClause, bindparam, delete, text
from sqlalchemy.dialects.postgresql import ARRAY, BIGINT, insert

from schemas.events import EpisodeSignals
from services.metadata.warehouse import episode_quality, near_duplicates, phash_bands

BANDS = 4
BAND_BITS = 16
BAND_MASK = (1 << BAND_BITS) - 1
UNIFORM_STD = 2.0  # luma std (0-255) below which a frame's hash says nothing about its content


def phash_int64(hex_hash: str) -> int:
    """A 16-hex-digit pHash as the signed 64-bit integer Postgres stores (`bigint`, two's
    complement). Raises ValueError for anything but 16 hex digits."""
    if len(hex_hash) != 16:
        raise ValueError(f"a pHash is 16 hex digits, not {hex_hash!r}")
    value = int(hex_hash, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def hamming(a: int, b: int) -> int:
    """Bits that differ between two 64-bit hashes (signed or unsigned)."""
    return ((a ^ b) & ((1 << 64) - 1)).bit_count()


def bands(h: int) -> list[int]:
    """The hash's `BANDS` values of `BAND_BITS` bits, band 0 the lowest bits (as the SQL:
    `(h >> 16 * band) & 65535`)."""
    return [(h >> (BAND_BITS * band)) & BAND_MASK for band in range(BANDS)]


def probe_radius(max_hamming: int) -> int:
    """Bits a band may differ in when the whole hash differs in at most `max_hamming`."""
    return max_hamming // BANDS


def probe_masks(radius: int) -> list[int]:
    """Every `BAND_BITS`-bit mask with at most `radius` bits set: a band's probes are its value
    XOR each of these."""
    return sorted(
        sum(1 << bit for bit in bits)
        for k in range(radius + 1)
        for bits in itertools.combinations(range(BAND_BITS), k)
    )


def signature(signals: EpisodeSignals) -> list[int]:
    """The episode's informative frame hashes (signed 64-bit), stream by stream in frame
    order: frames without a hash and uniform frames are left out."""
    out: list[int] = []
    for stream in signals.streams:
        for i, hex_hash in enumerate(stream.phash):
            std = stream.std_luma[i] if i < len(stream.std_luma) else None
            if hex_hash and (std is None or std >= UNIFORM_STD):
                out.append(phash_int64(hex_hash))
    return out


def matched(ours: Sequence[int], theirs: Sequence[int], max_hamming: int) -> int:
    """How many of `ours` have a hash of `theirs` within `max_hamming` bits."""
    return sum(1 for a in ours if any(hamming(a, b) <= max_hamming for b in theirs))


def shared_fraction(a: Sequence[int], b: Sequence[int], max_hamming: int) -> float:
    """The share of the shorter signature's hashes matched in the other (equal lengths: the
    larger of the two shares, so the figure is symmetric). 0 if either is empty."""
    if not a or not b:
        return 0.0
    share_a = matched(a, b, max_hamming) / len(a)
    share_b = matched(b, a, max_hamming) / len(b)
    if len(a) == len(b):
        return max(share_a, share_b)
    return share_a if len(a) < len(b) else share_b


def is_near_duplicate(
    a: Sequence[int], b: Sequence[int], max_hamming: int, min_shared: float
) -> bool:
    """The near-duplicate rule (the SQL in `near_duplicate_sql` applies the same)."""
    return shared_fraction(a, b, max_hamming) >= min_shared


@dataclass(frozen=True)
class QualitySummary:
    """An episode's signals summarized (`episode_quality`): sharpness over its sampled frames
    (variance of the Laplacian), the worst exposure, uniform frames and still time."""

    frames: int
    informative_frames: int
    min_sharpness: float | None
    median_sharpness: float | None
    max_highlights: float | None
    max_shadows: float | None
    still_s: float


def summarize(signals: EpisodeSignals) -> QualitySummary:
    sharp = sorted(v for s in signals.streams for v in s.sharpness)
    highlights = [v for s in signals.streams for v in s.highlights]
    shadows = [v for s in signals.streams for v in s.shadows]
    still = sum(end - start for s in signals.streams for start, end in s.still_spans_s)
    median = None
    if sharp:
        mid = len(sharp) // 2
        median = sharp[mid] if len(sharp) % 2 else (sharp[mid - 1] + sharp[mid]) / 2
    return QualitySummary(
        frames=sum(len(s.t_s) or len(s.phash) for s in signals.streams),
        informative_frames=len(signature(signals)),
        min_sharpness=sharp[0] if sharp else None,
        median_sharpness=median,
        max_highlights=max(highlights, default=None),
        max_shadows=max(shadows, default=None),
        still_s=still,
    )


def signature_statements(
    episode_id: str, pipeline_version: str, signals: EpisodeSignals
) -> list[Executable]:
    """Store the episode's summary and signature, and replace its banded hashes (the same
    rows on a replay)."""
    hashes = signature(signals)
    summary = summarize(signals)
    values = {
        "episode_id": episode_id,
        "pipeline_version": pipeline_version,
        "signals_version": signals.version,
        "sample_s": signals.sample_s,
        "frames": summary.frames,
        "informative_frames": summary.informative_frames,
        "min_sharpness": summary.min_sharpness,
        "median_sharpness": summary.median_sharpness,
        "max_highlights": summary.max_highlights,
        "max_shadows": summary.max_shadows,
        "still_s": summary.still_s,
        "phashes": hashes,
    }
    stmt = insert(episode_quality).values(**values)
    upsert = stmt.on_conflict_do_update(
        index_elements=["episode_id", "pipeline_version"],
        set_={k: stmt.excluded[k] for k in values if k not in ("episode_id", "pipeline_version")},
    )
    clear = delete(phash_bands).where(
        phash_bands.c.episode_id == episode_id, phash_bands.c.pipeline_version == pipeline_version
    )
    return [upsert, clear, _bands_sql(episode_id, pipeline_version, hashes)]


_BANDS_TEMPLATE = """
INSERT INTO phash_bands (pipeline_version, band, value, phash, episode_id, frame)
SELECT :pipeline_version, b.band, ((h.phash >> ({bits} * b.band)) & {mask})::int,
       h.phash, :episode_id, (h.frame - 1)::smallint
FROM unnest(CAST(:hashes AS bigint[])) WITH ORDINALITY AS h(phash, frame),
     generate_series(0, {last}) AS b(band)
"""


# Only constants are formatted into the SQL; every value is a bound parameter.
_CONSTANTS = {"bits": BAND_BITS, "mask": BAND_MASK, "last": BANDS - 1}
_BANDS_SQL = _BANDS_TEMPLATE.format(**_CONSTANTS)


def _bands_sql(episode_id: str, pipeline_version: str, hashes: list[int]) -> TextClause:
    return text(_BANDS_SQL).bindparams(
        bindparam("pipeline_version", value=pipeline_version),
        bindparam("episode_id", value=episode_id),
        bindparam("hashes", value=hashes, type_=ARRAY(BIGINT)),
    )


# Candidates: every stored hash within r of one of ours, through the band index (one probe per
# band, value and mask), then the rule on the two whole signatures (small: tens of hashes).
# The pair is stored once, the later episode (started_at, episode_id) naming the earlier.
_CANDIDATES_TEMPLATE = """
WITH q AS (
    SELECT h.phash FROM unnest(CAST(:hashes AS bigint[])) AS h(phash)
), probe AS (
    SELECT DISTINCT b.band, (((q.phash >> ({bits} * b.band)) & {mask})::int # m.mask)
           AS value, q.phash
    FROM q, generate_series(0, {last}) AS b(band),
         unnest(CAST(:masks AS int[])) AS m(mask)
)
SELECT DISTINCT p.episode_id
FROM probe
JOIN phash_bands p ON p.pipeline_version = :pipeline_version AND p.band = probe.band
     AND p.value = probe.value
WHERE bit_count((p.phash # probe.phash)::bit(64)) <= :max_hamming AND p.episode_id <> :episode_id
"""

_NEAR_TEMPLATE = """
WITH cand AS ({candidates}),
me AS (
    SELECT e.episode_id, e.started_at, q.phashes
    FROM episodes e JOIN episode_quality q ON q.episode_id = e.episode_id
    WHERE e.episode_id = :episode_id AND q.pipeline_version = :pipeline_version
),
pair AS (
    SELECT o.episode_id AS other_id, o.started_at AS other_started, oq.phashes AS theirs,
           cardinality(me.phashes) AS n_me, cardinality(oq.phashes) AS n_other,
           (SELECT count(*) FROM unnest(me.phashes) a
            WHERE EXISTS (SELECT 1 FROM unnest(oq.phashes) b
                          WHERE bit_count((a # b)::bit(64)) <= :max_hamming)) AS m_me,
           (SELECT count(*) FROM unnest(oq.phashes) b
            WHERE EXISTS (SELECT 1 FROM unnest(me.phashes) a
                          WHERE bit_count((a # b)::bit(64)) <= :max_hamming)) AS m_other,
           (SELECT min(bit_count((a # b)::bit(64))) FROM unnest(me.phashes) a, unnest(oq.phashes) b)
             AS min_distance
    FROM cand
    JOIN episodes o ON o.episode_id = cand.episode_id
    JOIN episode_quality oq ON oq.episode_id = o.episode_id
         AND oq.pipeline_version = :pipeline_version
    CROSS JOIN me
), scored AS (
    SELECT pair.*,
           CASE WHEN n_me < n_other THEN m_me::float8 / n_me
                WHEN n_other < n_me THEN m_other::float8 / n_other
                ELSE greatest(m_me, m_other)::float8 / n_me END AS shared,
           least(n_me, n_other) AS frames
    FROM pair
    WHERE n_me > 0 AND n_other > 0
)
INSERT INTO near_duplicates
    (pipeline_version, episode_id, duplicate_of, shared, frames, min_distance)
SELECT :pipeline_version,
       CASE WHEN (s.other_started, s.other_id) < (me.started_at, me.episode_id)
            THEN me.episode_id ELSE s.other_id END,
       CASE WHEN (s.other_started, s.other_id) < (me.started_at, me.episode_id)
            THEN s.other_id ELSE me.episode_id END,
       s.shared, s.frames, s.min_distance
FROM scored s CROSS JOIN me
WHERE s.shared >= :min_shared
ON CONFLICT (pipeline_version, episode_id, duplicate_of) DO UPDATE
SET shared = excluded.shared, frames = excluded.frames, min_distance = excluded.min_distance
"""
CANDIDATES_SQL = _CANDIDATES_TEMPLATE.format(**_CONSTANTS)
_NEAR_SQL = _NEAR_TEMPLATE.format(candidates=CANDIDATES_SQL)


def candidates_sql(
    episode_id: str, pipeline_version: str, hashes: list[int], max_hamming: int
) -> TextClause:
    """Episodes holding a frame hash within `max_hamming` of one of `hashes` (the index
    lookup alone: the bench times it)."""
    return text(CANDIDATES_SQL).bindparams(
        *_lookup_params(episode_id, pipeline_version, hashes, max_hamming)
    )


def _lookup_params(
    episode_id: str, pipeline_version: str, hashes: list[int], max_hamming: int
) -> list[BindParameter[Any]]:
    return [
        bindparam("episode_id", value=episode_id),
        bindparam("pipeline_version", value=pipeline_version),
        bindparam("hashes", value=hashes, type_=ARRAY(BIGINT)),
        bindparam("masks", value=probe_masks(probe_radius(max_hamming))),
        bindparam("max_hamming", value=max_hamming),
    ]


def near_duplicate_statements(
    episode_id: str,
    pipeline_version: str,
    signals: EpisodeSignals,
    max_hamming: int,
    min_shared: float,
) -> list[Executable]:
    """Forget the episode's pairs, then store every pair it forms with another stored episode
    (run after `signature_statements`, in the same transaction)."""
    forget = delete(near_duplicates).where(
        near_duplicates.c.pipeline_version == pipeline_version,
        (near_duplicates.c.episode_id == episode_id)
        | (near_duplicates.c.duplicate_of == episode_id),
    )
    find = text(_NEAR_SQL).bindparams(
        *_lookup_params(episode_id, pipeline_version, signature(signals), max_hamming),
        bindparam("min_shared", value=min_shared),
    )
    return [forget, find]
