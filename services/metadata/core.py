"""Pure SQL building for the metadata service: one event -> the idempotent upserts it implies.

Every statement is an upsert keyed by a natural key (episode id, object key, clip key +
pipeline version...), so replaying any event, in any order, converges to the same warehouse.
Episode status only moves forward (see `EpisodeStatus.rank`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    Connection,
    Executable,
    Table,
    TextClause,
    bindparam,
    case,
    func,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from schemas.events import (
    TOPIC_ANNOTATED,
    TOPIC_DECODED,
    TOPIC_SHARDS,
    TOPIC_UPLOADED,
    TOPIC_VALIDATED,
    DlqRecord,
    EpisodeDecoded,
    EpisodeRef,
    EpisodesAnnotated,
    EpisodeUploaded,
    EpisodeValidated,
    ShardsWritten,
    StreamInfo,
    Verdict,
)
from services.common.settings import CurationSettings
from services.media.members import member_labels
from services.metadata.duplicates import near_duplicate_statements, signature_statements
from services.metadata.imu_duplicates import imu_signature_statements
from services.metadata.layers import annotated_statement, check_version, layer_content
from services.metadata.packing import FACTS_COLUMN, PACKED_COLUMN, facts_sql, pack_sql
from services.metadata.warehouse import (
    CLIP_QUALITY_COLUMNS,
    EPISODE_QUALITY_COLUMNS,
    TIMING_COLUMNS,
    clips,
    dead_letters,
    decode_meta,
    devices,
    episode_refs,
    episodes,
    pipeline_versions,
    raw_objects,
    shards,
    verdicts,
)
from services.sensors.imu_signature import ImuRule


class EpisodeStatus(StrEnum):
    """Where an episode is in the pipeline, as the warehouse records it (`episodes.status`).
    A status only moves forward (`rank`): a late or replayed event never moves it back."""

    UPLOADED = "uploaded"
    DECODED = "decoded"
    VALIDATED = "validated"
    SHARDED = "sharded"
    REJECTED = "rejected"
    DEAD_LETTERED = "dead_lettered"

    @property
    def rank(self) -> int:
        """uploaded 1 < decoded 2 < validated 3 < sharded 4; the terminal rejections rank 5,
        so nothing resurrects them."""
        return _STATUS_RANK[self]

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


_STATUS_RANK = {
    EpisodeStatus.UPLOADED: 1,
    EpisodeStatus.DECODED: 2,
    EpisodeStatus.VALIDATED: 3,
    EpisodeStatus.SHARDED: 4,
    EpisodeStatus.REJECTED: 5,
    EpisodeStatus.DEAD_LETTERED: 5,
}
TERMINAL = frozenset({EpisodeStatus.SHARDED, EpisodeStatus.REJECTED, EpisodeStatus.DEAD_LETTERED})


def assign_split(group_key: str, eval_fraction: float) -> str:
    """A stable split from a hash of the grouping key (session or device id).

    The same key always maps to the same split, whatever else is in the corpus, so growing the
    corpus never moves an episode and a session never straddles train and eval.
    """
    bucket = int.from_bytes(hashlib.sha256(group_key.encode()).digest()[:8], "big") / 2**64
    return "eval" if bucket < eval_fraction else "train"


def upsert_episode(
    ref: EpisodeRef, status: EpisodeStatus, split_key: str, eval_fraction: float
) -> list[Executable]:
    group = ref.session_id if split_key == "session" else ref.device_id
    stmt = insert(episodes).values(
        episode_id=ref.episode_id,
        device_id=ref.device_id,
        session_id=ref.session_id,
        started_at=ref.started_at,
        split=assign_split(group, eval_fraction),
        tags=sorted(set(ref.tags)),
        status=status.value,
        status_rank=status.rank,
    )
    advance = stmt.excluded.status_rank > episodes.c.status_rank
    stmt = stmt.on_conflict_do_update(
        index_elements=[episodes.c.episode_id],
        set_={
            "status": case((advance, stmt.excluded.status), else_=episodes.c.status),
            "status_rank": func.greatest(stmt.excluded.status_rank, episodes.c.status_rank),
            "updated_at": func.now(),
        },
    )
    raws = [
        insert(raw_objects)
        .values(
            object_key=f.key,
            episode_id=ref.episode_id,
            kind=kind,
            sha256=f.sha256,
            size_bytes=f.size_bytes,
        )
        .on_conflict_do_nothing()
        for kind, f in (
            ("video", ref.video),
            ("imu", ref.imu),
            *(("camera", c.file) for _, c in sorted(ref.cameras.items())),
        )
        if f is not None
    ]
    device = insert(devices).values(device_id=ref.device_id).on_conflict_do_nothing()
    return [device, stmt, *raws]


@dataclass(frozen=True)
class Upserts:
    """What one record does to the warehouse: its statements, and the episodes whose manifest
    rows must be refreshed after them (`refresh_manifest_episodes`)."""

    statements: list[Executable]
    episode_ids: frozenset[str] = frozenset()


def statements_for(
    topic: str,
    body: bytes,
    split_key: str,
    eval_fraction: float,
    curation: CurationSettings | None = None,
) -> Upserts:
    """The upserts for one record of `topic` (a stage topic or a DLQ); `curation` gives the
    near-duplicate rule (default: the defaults). Raises ValidationError or ValueError for a
    record that isn't a valid event."""
    if topic == TOPIC_UPLOADED:
        up = EpisodeUploaded.model_validate_json(body)
        return Upserts(
            [
                _seen(up.pipeline_version),
                *upsert_episode(up.episode, EpisodeStatus.UPLOADED, split_key, eval_fraction),
                _episode_ref_row(up),
            ],
            frozenset({up.episode.episode_id}),
        )
    if topic == TOPIC_DECODED:
        dec = EpisodeDecoded.model_validate_json(body)
        return Upserts(
            [
                _seen(dec.pipeline_version),
                *upsert_episode(dec.episode, EpisodeStatus.DECODED, split_key, eval_fraction),
                _decode_row(dec),
            ],
            frozenset({dec.episode.episode_id}),
        )
    if topic == TOPIC_VALIDATED:
        val = EpisodeValidated.model_validate_json(body)
        status = (
            EpisodeStatus.REJECTED if val.verdict is Verdict.REJECT else EpisodeStatus.VALIDATED
        )
        return Upserts(
            [
                _seen(val.pipeline_version),
                *upsert_episode(val.decoded.episode, status, split_key, eval_fraction),
                _decode_row(val.decoded),
                _verdict_row(val),
                *_signal_rows(val, curation or CurationSettings()),
            ],
            frozenset({val.decoded.episode.episode_id}),
        )
    if topic == TOPIC_SHARDS:
        event = ShardsWritten.model_validate_json(body)
        return Upserts(
            [_seen(event.pipeline_version), *_shard_rows(event, split_key, eval_fraction)],
            frozenset(ref.episode_id for ref in event.episodes),
        )
    if topic == TOPIC_ANNOTATED:
        # A layer is not derived by the pipeline: no pipeline version seen, and no manifest
        # row changes (manifests join layers when they are built).
        return Upserts([_layer_version(EpisodesAnnotated.model_validate_json(body))])
    if topic.endswith(".dlq"):
        return Upserts(
            _dead_letter_rows(DlqRecord.model_validate_json(body), split_key, eval_fraction)
        )
    raise ValueError(f"metadata does not consume {topic}")


def _seen(pipeline_version: str) -> Executable:
    stmt = insert(pipeline_versions).values(pipeline_version=pipeline_version)
    return stmt.on_conflict_do_update(
        index_elements=[pipeline_versions.c.pipeline_version], set_={"last_seen": func.now()}
    )


# Recompute the manifest rows of some episodes from the normalized tables (all pipeline
# versions). Inner joins: a row appears once its episode has clips, a verdict, a probe and a raw
# video, whatever order the events came in; recomputing from scratch makes replays converge.
# An episode's quality values are its worst clip's (null if any clip lacks one); its
# `duplicate_of` is the earliest (started_at, episode id) earlier episode with the same raw
# video bytes (`exact`), else the earliest it is a near duplicate of by pHash or IMU signature
# (`near` if the pHash rule holds for that pair, with or without the IMU; `imu` if only the
# IMU signature does).
_REFRESH_SQL = """
WITH c AS (
    SELECT clips.*,
           dense_rank() OVER (
               PARTITION BY clips.pipeline_version, clips.episode_id ORDER BY clips.shard_key
           ) - 1 AS shard_no
    FROM clips
    {where}
), g AS (
    SELECT c.pipeline_version, e.episode_id, e.device_id, e.session_id, e.started_at, e.split,
           e.tags, v.verdict, jsonb_array_length(v.warnings) AS warning_count, d.codec,
           d.width, d.height, d.fps, r.object_key AS raw_key, r.sha256 AS raw_sha256,
           count(*)::int AS clip_count,
           array_agg(DISTINCT c.shard_key ORDER BY c.shard_key) AS shard_keys,
           d.stream_labels, d.stream_count, d.salvaged_s IS NOT NULL AS salvaged,
           {timing_values},
           {quality_values},
           {packed_values} AS {packed_columns}
    FROM c
    JOIN episodes e ON e.episode_id = c.episode_id
    JOIN verdicts v ON v.episode_id = c.episode_id AND v.pipeline_version = c.pipeline_version
    JOIN decode_meta d ON d.episode_id = c.episode_id AND d.pipeline_version = c.pipeline_version
    JOIN raw_objects r ON r.episode_id = c.episode_id AND r.kind = 'video'
    GROUP BY c.pipeline_version, e.episode_id, v.episode_id, v.pipeline_version,
             d.episode_id, d.pipeline_version, r.object_key
)
INSERT INTO manifest_episodes AS m (
    pipeline_version, episode_id, device_id, session_id, started_at, split, tags, verdict,
    warning_count, codec, width, height, fps, raw_key, raw_sha256, clip_count, shard_keys,
    stream_labels, stream_count, salvaged, {timing_columns}, {quality_columns},
    {packed_columns}, {facts_column}, duplicate_of, duplicate_kind
)
SELECT g.*, {facts_values} AS {facts_column}, dup.duplicate_of, dup.kind
FROM g
LEFT JOIN LATERAL (
    SELECT x.duplicate_of, x.kind FROM (
        SELECT o.episode_id AS duplicate_of, 'exact' AS kind, 0 AS precedence, o.started_at
        FROM raw_objects ro JOIN episodes o ON o.episode_id = ro.episode_id
        WHERE ro.kind = 'video' AND ro.sha256 = g.raw_sha256
          AND (o.started_at, o.episode_id) < (g.started_at, g.episode_id)
        UNION ALL
        SELECT o.episode_id, 'near', 1, o.started_at
        FROM near_duplicates n JOIN episodes o ON o.episode_id = n.duplicate_of
        WHERE n.pipeline_version = g.pipeline_version AND n.episode_id = g.episode_id
        UNION ALL
        SELECT o.episode_id, 'imu', 2, o.started_at
        FROM imu_duplicates n JOIN episodes o ON o.episode_id = n.duplicate_of
        WHERE n.pipeline_version = g.pipeline_version AND n.episode_id = g.episode_id
    ) x
    ORDER BY least(x.precedence, 1), x.started_at, x.duplicate_of, x.precedence
    LIMIT 1
) dup ON true
ON CONFLICT (pipeline_version, episode_id) DO UPDATE SET {updates}
"""
_REFRESHED = (
    "device_id",
    "session_id",
    "started_at",
    "split",
    "tags",
    "verdict",
    "warning_count",
    "codec",
    "width",
    "height",
    "fps",
    "raw_key",
    "raw_sha256",
    "clip_count",
    "shard_keys",
    "stream_labels",
    "stream_count",
    "salvaged",
    *TIMING_COLUMNS,
    *EPISODE_QUALITY_COLUMNS,
    PACKED_COLUMN,
    FACTS_COLUMN,
    "duplicate_of",
    "duplicate_kind",
)
# (manifest_episodes column, aggregate over the episode's clips `c`): the worst clip.
_EPISODE_QUALITY = (
    ("min_sharpness", "min", "sharpness"),
    ("max_frozen_fraction", "max", "frozen_fraction"),
    ("max_highlights", "max", "highlights"),
    ("max_shadows", "max", "shadows"),
    ("min_mean_luma", "min", "mean_luma"),
    ("max_mean_luma", "max", "mean_luma"),
    ("min_motion", "min", "motion"),
)
if tuple(name for name, _, _ in _EPISODE_QUALITY) != EPISODE_QUALITY_COLUMNS:
    raise RuntimeError("_EPISODE_QUALITY must list EPISODE_QUALITY_COLUMNS in order")


def _refresh_sql(where: str) -> str:
    return _REFRESH_SQL.format(
        where=where,
        packed_columns=PACKED_COLUMN,
        packed_values=pack_sql(),
        facts_column=FACTS_COLUMN,
        facts_values=facts_sql(),
        timing_columns=", ".join(TIMING_COLUMNS),
        timing_values=", ".join(f"d.{name}" for name in TIMING_COLUMNS),
        quality_columns=", ".join(EPISODE_QUALITY_COLUMNS),
        quality_values=",\n           ".join(
            f"CASE WHEN count(c.{col}) = count(*) THEN {fn}(c.{col}) END AS {name}"
            for name, fn, col in _EPISODE_QUALITY
        ),
        updates=", ".join(f"{col} = excluded.{col}" for col in _REFRESHED),
    )


# The episodes whose `duplicate_of` may change with these: the same raw video bytes, or a
# near-duplicate pair (pHash or IMU) with one of them (either side).
_RELATED = """ARRAY(
    SELECT unnest(CAST(:episode_ids AS varchar[]))
    UNION SELECT o.episode_id FROM raw_objects r
          JOIN raw_objects o ON o.sha256 = r.sha256 AND o.kind = 'video'
          WHERE r.kind = 'video' AND r.episode_id = ANY(:episode_ids)
    UNION SELECT n.duplicate_of FROM near_duplicates n WHERE n.episode_id = ANY(:episode_ids)
    UNION SELECT n.episode_id FROM near_duplicates n WHERE n.duplicate_of = ANY(:episode_ids)
    UNION SELECT n.duplicate_of FROM imu_duplicates n WHERE n.episode_id = ANY(:episode_ids)
    UNION SELECT n.episode_id FROM imu_duplicates n WHERE n.duplicate_of = ANY(:episode_ids)
)"""


def refresh_manifest_episodes(episode_ids: list[str]) -> TextClause:
    """The statement that recomputes `manifest_episodes` for these episodes and those whose
    duplicate status they decide (`_RELATED`)."""
    sql = _refresh_sql(f"WHERE clips.episode_id = ANY({_RELATED})")
    return text(sql).bindparams(bindparam("episode_ids", value=sorted(episode_ids)))


def refresh_all_manifest_episodes(conn: Connection, step: int = 50_000) -> Iterator[int]:
    """Recompute `manifest_episodes` for every episode, in slices of `step` episodes (keyset
    pagination: each slice's sorts fit in memory); yields the episodes done so far. For
    migrations and bulk loads; the service refreshes only what a batch touched."""
    conn.exec_driver_sql("SET LOCAL work_mem = '256MB'")
    # Plan every slice for its own ids: psycopg prepares a statement on its 5th execution and
    # Postgres may switch a prepared statement to a generic plan after 5 more, i.e. on the 11th
    # slice, where the id array is an unknown parameter. Seen with 1M seeded episodes
    # (`bench first-batch`): slices 1-10 took 10-60 s, the 11th ran 18 minutes, CPU-bound.
    conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
    done, last = 0, ""
    while True:
        ids = list(
            conn.execute(
                select(episodes.c.episode_id)
                .where(episodes.c.episode_id > last)
                .order_by(episodes.c.episode_id)
                .limit(step)
            ).scalars()
        )
        if not ids:
            return
        conn.execute(refresh_manifest_episodes(ids))
        done, last = done + len(ids), ids[-1]
        yield done


def _layer_version(event: EpisodesAnnotated) -> Executable:
    """A whole layer version from one event (raises LayerRecordError, a ValueError, when its
    rows break a whole-version rule: the same target twice, overlapping device windows)."""
    kind, rows = event.layer.kind, list(event.layer.rows)
    check_version(kind, rows, f"{TOPIC_ANNOTATED} {kind.value} {event.version}")
    content = layer_content(kind, rows)
    return annotated_statement(kind, event.version, event.author, event.source, content)


def _episode_ref_row(up: EpisodeUploaded) -> Executable:
    """An episode's announcement. Announced again (a backfill, a re-run agent) the ref is the
    same; of the event ids the smallest is kept, so any replay order gives the same row."""
    stmt = insert(episode_refs).values(
        episode_id=up.episode.episode_id,
        ref=up.episode.model_dump(mode="json"),
        event_id=up.event_id,
    )
    return stmt.on_conflict_do_update(
        index_elements=[episode_refs.c.episode_id],
        set_={"ref": stmt.excluded.ref, "event_id": stmt.excluded.event_id},
        where=stmt.excluded.event_id < episode_refs.c.event_id,
    )


def _upsert(table: Table, values: dict[str, Any]) -> Executable:
    """Insert a row, or on a primary-key conflict overwrite its other given columns."""
    keys = {column.name for column in table.primary_key.columns}
    stmt = insert(table).values(**values)
    return stmt.on_conflict_do_update(
        index_elements=sorted(keys),
        set_={k: stmt.excluded[k] for k in values if k not in keys},
    )


def timing_figures(dec: EpisodeDecoded) -> dict[str, float]:
    """The episode's time-integrity figures (`TIMING_COLUMNS`): the worst video stream of any
    camera, the largest camera start skew, the IMU's start skew and rate (0 when absent)."""
    streams = [*dec.streams, *(s for c in dec.cameras for s in c.streams)]
    main = dec.streams[dec.primary_stream]
    skews = [
        abs(c.streams[0].start_s + c.offset_s - main.start_s) for c in dec.cameras if c.streams
    ]
    return {
        "max_jitter_s": max((s.jitter_s for s in streams), default=0.0),
        "max_frame_gap_s": max((s.max_gap_s for s in streams), default=0.0),
        "max_drift_ppm": max((abs(s.drift_ppm) for s in streams), default=0.0),
        "camera_skew_s": max(skews, default=0.0),
        "imu_skew_s": abs(dec.imu.start_skew_s) if dec.imu else 0.0,
        "imu_rate_hz": dec.imu.rate_hz if dec.imu else 0.0,
    }


def _labels(dec: EpisodeDecoded) -> list[str]:
    sources = [_Source(dec.episode.camera, dec.streams)]
    sources += [_Source(c.name, c.streams) for c in dec.cameras]
    labels = list(member_labels(sources).values())
    return [*labels, "imu"] if dec.episode.imu is not None else labels


@dataclass(frozen=True)
class _Source:
    camera: str
    streams: list[StreamInfo]


def _decode_row(dec: EpisodeDecoded) -> Executable:
    s = dec.streams[dec.primary_stream]
    labels = _labels(dec)
    values = {
        "episode_id": dec.episode.episode_id,
        "pipeline_version": dec.pipeline_version,
        "event_id": dec.event_id,
        "container_format": dec.container_format,
        "duration_s": dec.duration_s,
        "codec": s.codec,
        "width": s.width,
        "height": s.height,
        "fps": s.fps,
        "frame_count": s.frame_count,
        "keyframe_count": s.keyframe_count,
        "streams": [x.model_dump() for x in dec.streams],
        "cameras": [c.model_dump(mode="json") for c in dec.cameras],
        "audio_streams": [a.model_dump() for a in dec.audio_streams],
        "imu": None if dec.imu is None else dec.imu.model_dump(),
        "salvaged_s": dec.salvaged_s,
        "stream_labels": ",".join(labels)[:512],
        "stream_count": len([x for x in labels if x != "imu"]),
        **timing_figures(dec),
    }
    return _upsert(decode_meta, values)


def _verdict_row(val: EpisodeValidated) -> Executable:
    values = {
        "episode_id": val.decoded.episode.episode_id,
        "pipeline_version": val.pipeline_version,
        "event_id": val.event_id,
        "verdict": val.verdict.value,
        "reasons": [r.model_dump(mode="json") for r in val.reasons],
        "warnings": [w.model_dump(mode="json") for w in val.warnings],
    }
    return _upsert(verdicts, values)


def _signal_rows(val: EpisodeValidated, curation: CurationSettings) -> list[Executable]:
    """The episode's IMU signature and the pairs it finds, then its signals summary and pHash
    signature and their near duplicates, among the episodes stored so far (either side of a
    pair may be the later one)."""
    episode_id = val.decoded.episode.episode_id
    imu = imu_signature_statements(
        episode_id, val.pipeline_version, val.decoded.imu_signature, imu_rule(curation)
    )
    if val.signals is None:
        return imu
    return [
        *imu,
        *signature_statements(episode_id, val.pipeline_version, val.signals),
        *near_duplicate_statements(
            episode_id,
            val.pipeline_version,
            val.signals,
            curation.near_dup_max_hamming,
            curation.near_dup_min_shared,
        ),
    ]


def _shard_rows(event: ShardsWritten, split_key: str, eval_fraction: float) -> list[Executable]:
    out: list[Executable] = []
    for ref in event.episodes:
        out += upsert_episode(ref, EpisodeStatus.SHARDED, split_key, eval_fraction)
    out.append(
        insert(shards)
        .values(
            shard_key=event.shard_key,
            index_key=event.index_key,
            sha256=event.shard_sha256,
            size_bytes=event.size_bytes,
            clip_count=len(event.clips),
            pipeline_version=event.pipeline_version,
            event_id=event.event_id,
        )
        .on_conflict_do_nothing()
    )
    for clip in event.clips:
        quality = clip.quality.model_dump() if clip.quality is not None else {}
        values = {
            **clip.model_dump(exclude={"quality"}),
            **{name: quality.get(name) for name in CLIP_QUALITY_COLUMNS},
            "shard_key": event.shard_key,
            "pipeline_version": event.pipeline_version,
        }
        out.append(_upsert(clips, values))
    return out


def _dead_letter_rows(record: DlqRecord, split_key: str, eval_fraction: float) -> list[Executable]:
    ref = _episode_in(record)
    out: list[Executable] = []
    if ref is not None:
        out += upsert_episode(ref, EpisodeStatus.DEAD_LETTERED, split_key, eval_fraction)
    out.append(
        insert(dead_letters)
        .values(
            event_id=record.event_id,
            stage=record.stage,
            source_topic=record.source_topic,
            reason_code=record.reason_code.value,
            reason=record.reason,
            episode_id=ref.episode_id if ref else None,
            failed_at=record.failed_at,
        )
        .on_conflict_do_nothing()
    )
    if ref is not None:
        # A dead letter ends the episode's journey even if it was already further along.
        out.append(
            update(episodes)
            .where(
                episodes.c.episode_id == ref.episode_id,
                episodes.c.status_rank < EpisodeStatus.DEAD_LETTERED.rank,
            )
            .values(
                status=EpisodeStatus.DEAD_LETTERED.value,
                status_rank=EpisodeStatus.DEAD_LETTERED.rank,
            )
        )
    return out


def _episode_in(record: DlqRecord) -> EpisodeRef | None:
    """The episode a dead-lettered record was about, if the original says so validly."""
    if record.original_encoding != "utf-8":
        return None
    try:
        payload = json.loads(record.original_value)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(payload, dict):
        return None
    # The original is untrusted (it was dead-lettered): any field may have any type.
    decoded = payload.get("decoded")
    candidate = payload.get("episode") or (
        decoded.get("episode") if isinstance(decoded, dict) else None
    )
    try:
        return EpisodeRef.model_validate(candidate) if candidate else None
    except ValidationError:
        return None


def imu_rule(curation: CurationSettings) -> ImuRule:
    """The IMU near-duplicate rule from the settings (`EGOLINE_CURATION_IMU_DUP_*`)."""
    return ImuRule(
        min_votes=curation.imu_dup_min_votes,
        min_correlation=curation.imu_dup_min_correlation,
        min_overlap_s=curation.imu_dup_min_overlap_s,
        min_cover=curation.imu_dup_min_cover,
    )
