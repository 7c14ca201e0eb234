"""Lineage: from a manifest row (or an episode) back to the raw object it came from.

`lineage_query` is pure SQL building; `lineage` runs it. A row's lineage is the raw video object
and its sha256, the device, session and start time, the pipeline version, the validation verdict
with its reasons and warnings, the probe, the clip's shard with its sha256 and byte ranges, its
quality values, the episode's signals summary and the earlier episode it duplicates (if any).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Select, and_, select

from services.metadata.warehouse import (
    CLIP_QUALITY_COLUMNS,
    clips,
    decode_meta,
    episode_quality,
    episodes,
    manifest_episodes,
    raw_objects,
    shards,
    verdicts,
)


def lineage_query(episode_id: str, pipeline_version: str, clip_index: int | None) -> Select[Any]:
    """Every clip of an episode (or one, by index) with everything it came from; parameters
    are bound, never SQL text."""
    raw = raw_objects.alias("raw")
    query = (
        select(
            clips.c.clip_key,
            clips.c.clip_index,
            clips.c.episode_id,
            episodes.c.device_id,
            episodes.c.session_id,
            episodes.c.started_at,
            episodes.c.split,
            episodes.c.tags,
            episodes.c.status,
            clips.c.pipeline_version,
            raw.c.object_key.label("raw_key"),
            raw.c.sha256.label("raw_sha256"),
            raw.c.size_bytes.label("raw_size_bytes"),
            verdicts.c.verdict,
            verdicts.c.reasons,
            verdicts.c.warnings,
            verdicts.c.event_id.label("verdict_event_id"),
            decode_meta.c.codec,
            decode_meta.c.width,
            decode_meta.c.height,
            decode_meta.c.fps,
            decode_meta.c.event_id.label("decode_event_id"),
            clips.c.shard_key,
            shards.c.sha256.label("shard_sha256"),
            shards.c.index_key.label("shard_index_key"),
            shards.c.event_id.label("shard_event_id"),
            clips.c.mp4_offset.label("byte_offset"),
            clips.c.mp4_length.label("length"),
            clips.c.imu_offset,
            clips.c.imu_length,
            clips.c.json_offset,
            clips.c.json_length,
            clips.c.start_s,
            clips.c.duration_s,
            clips.c.frame_count,
            clips.c.members,
            decode_meta.c.cameras,
            decode_meta.c.stream_labels,
            decode_meta.c.salvaged_s,
            *(clips.c[name] for name in CLIP_QUALITY_COLUMNS),
            episode_quality.c.min_sharpness.label("episode_min_sharpness"),
            episode_quality.c.median_sharpness.label("episode_median_sharpness"),
            episode_quality.c.informative_frames.label("episode_signal_frames"),
            manifest_episodes.c.duplicate_of,
            manifest_episodes.c.duplicate_kind,
        )
        .select_from(clips)
        .join(episodes, episodes.c.episode_id == clips.c.episode_id)
        .join(shards, shards.c.shard_key == clips.c.shard_key)
        .join(raw, and_(raw.c.episode_id == clips.c.episode_id, raw.c.kind == "video"))
        .outerjoin(
            verdicts,
            and_(
                verdicts.c.episode_id == clips.c.episode_id,
                verdicts.c.pipeline_version == clips.c.pipeline_version,
            ),
        )
        .outerjoin(
            decode_meta,
            and_(
                decode_meta.c.episode_id == clips.c.episode_id,
                decode_meta.c.pipeline_version == clips.c.pipeline_version,
            ),
        )
        .outerjoin(
            episode_quality,
            and_(
                episode_quality.c.episode_id == clips.c.episode_id,
                episode_quality.c.pipeline_version == clips.c.pipeline_version,
            ),
        )
        .outerjoin(
            manifest_episodes,
            and_(
                manifest_episodes.c.episode_id == clips.c.episode_id,
                manifest_episodes.c.pipeline_version == clips.c.pipeline_version,
            ),
        )
        .where(clips.c.episode_id == episode_id, clips.c.pipeline_version == pipeline_version)
        .order_by(clips.c.clip_index)
    )
    if clip_index is not None:
        query = query.where(clips.c.clip_index == clip_index)
    return query


def lineage(
    engine: Engine, episode_id: str, pipeline_version: str, clip_index: int | None = None
) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(lineage_query(episode_id, pipeline_version, clip_index))
        return [dict(row._mapping) for row in result]


def mismatches(manifest_row: dict[str, Any], warehouse_row: dict[str, Any]) -> list[str]:
    """Fields where a manifest row and the warehouse disagree (a stale or foreign manifest)."""
    fields = ("shard_key", "byte_offset", "length", "raw_sha256", "device_id", "pipeline_version")
    return [f for f in fields if f in manifest_row and manifest_row[f] != warehouse_row.get(f)]
