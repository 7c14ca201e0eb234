"""Manifest query building: filters -> one parameterised SQL statement (pure).

Filter values are always bound parameters ($1, $2, ...), never SQL text. The ORDER BY makes
the result order total, so the same data gives the same rows in the same order, and so a
byte-identical Arrow file.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_FORMAT_VERSION = 1

COLUMNS = """
    c.shard_key,
    c.mp4_offset AS byte_offset,
    c.mp4_length AS length,
    c.imu_offset,
    c.imu_length,
    c.json_offset,
    c.json_length,
    c.clip_key,
    c.episode_id,
    e.device_id,
    e.session_id,
    e.started_at,
    c.clip_index,
    c.start_s AS clip_start_s,
    c.duration_s AS clip_duration_s,
    c.frame_count,
    e.split,
    v.verdict,
    jsonb_array_length(v.warnings) AS warning_count,
    d.codec,
    d.width,
    d.height,
    d.fps,
    r.object_key AS raw_key,
    r.sha256 AS raw_sha256,
    c.pipeline_version
"""

FROM = """
FROM clips c
JOIN episodes e ON e.episode_id = c.episode_id
JOIN verdicts v ON v.episode_id = c.episode_id AND v.pipeline_version = c.pipeline_version
JOIN decode_meta d ON d.episode_id = c.episode_id AND d.pipeline_version = c.pipeline_version
JOIN raw_objects r ON r.episode_id = c.episode_id AND r.kind = 'video'
"""


class ManifestFilter(BaseModel):
    """What goes into a manifest. Every field is optional; empty means no restriction."""

    model_config = ConfigDict(frozen=True)

    pipeline_version: str = "v1"
    started_from: datetime | None = None
    started_before: datetime | None = None
    devices: list[str] = Field(default_factory=list)
    splits: list[str] = Field(default_factory=list)
    verdicts: list[str] = Field(default_factory=lambda: ["accept", "accept_with_warnings"])
    max_warnings: int | None = Field(
        default=None, ge=0, description="min quality: at most N warnings"
    )


def build_query(flt: ManifestFilter) -> tuple[str, list[object]]:
    """The manifest SQL and its positional parameters."""
    params: list[object] = []

    def bind(value: object) -> str:
        params.append(value)
        return f"${len(params)}"

    where = [f"c.pipeline_version = {bind(flt.pipeline_version)}"]
    if flt.verdicts:
        where.append(f"v.verdict = ANY({bind(list(flt.verdicts))}::text[])")
    if flt.started_from is not None:
        where.append(f"e.started_at >= {bind(flt.started_from)}")
    if flt.started_before is not None:
        where.append(f"e.started_at < {bind(flt.started_before)}")
    if flt.devices:
        where.append(f"e.device_id = ANY({bind(list(flt.devices))}::text[])")
    if flt.splits:
        where.append(f"e.split = ANY({bind(list(flt.splits))}::text[])")
    if flt.max_warnings is not None:
        where.append(f"jsonb_array_length(v.warnings) <= {bind(flt.max_warnings)}")
    sql = (
        f"SELECT {COLUMNS.strip()}\n{FROM.strip()}\nWHERE "
        + "\n  AND ".join(where)
        + "\nORDER BY c.episode_id, c.clip_index, c.clip_key"
    )
    return sql, params
