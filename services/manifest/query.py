"""Manifest query building: filters -> one parameterised SQL statement (pure).

Filter values are always bound parameters ($1, $2, ...), never SQL text. The query reads
`manifest_episodes` (one row per episode, its clips packed) in primary-key order, which makes the
order total, so the same data gives the same rows in the same order and a byte-identical file.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.layers import LATEST, LayerKind
from services.common.settings import CurationSettings
from services.metadata.packing import FACTS_COLUMN, PACKED_COLUMN
from services.metadata.warehouse import TIMING_COLUMNS

MANIFEST_FORMAT_VERSION = 6

# Episode-level columns: one row per (pipeline version, episode) of `manifest_episodes`; the
# build explodes each into its clips (`clip_count`, `shard_keys`, the packed `clips` records).
EPISODE_COLUMNS = """
    m.episode_id,
    m.device_id,
    m.session_id,
    m.started_at,
    m.split,
    m.verdict,
    m.warning_count,
    m.codec,
    m.width,
    m.height,
    m.fps,
    m.raw_key,
    m.raw_sha256,
    m.pipeline_version,
    m.clip_count,
    m.shard_keys,
    m.stream_labels,
    m.stream_count,
    m.duplicate_of,
""" + ",\n".join(f"    m.{name}" for name in TIMING_COLUMNS)
COLUMNS = f"{EPISODE_COLUMNS.strip()},\n    m.{PACKED_COLUMN}"

# The episode-level columns split between the build's two passes over the same rows (one
# snapshot, services/manifest/snapshot.py): the *heads*, read first (a covering index holds
# them), give the dictionaries that must precede the first record batch of the file: the
# unique strings (the heads themselves are their dictionaries) and the shared ones whose
# distinct values come from the heads. The *bodies* (everything else: the packed facts and
# clips, the shard keys, a few shared strings) then stream while the file is written; their
# shared strings' dictionaries grow as values first appear (delta dictionary batches).
HEAD_COLUMNS = (
    "episode_id",
    "session_id",
    "raw_key",
    "raw_sha256",
    "clip_count",
    "split",
    "verdict",
    "pipeline_version",
    "duplicate_of",
    "device_id",
    "codec",
    "stream_labels",
)
HEAD_SHARED = (
    "device_id",
    "session_id",
    "split",
    "verdict",
    "codec",
    "pipeline_version",
    "stream_labels",
)
BODY_COLUMNS = (FACTS_COLUMN, "shard_keys", PACKED_COLUMN)
# Of the heads, the short strings shared by many episodes travel as one text field, joined by
# HEADS_SEPARATOR in this order, that the client splits once per distinct combination
# (services/manifest/explode.py `unpack_heads`): Postgres formats and ADBC parses each field of
# each row, and one field for five saves ~0.45 CPU-s per 1M episodes, most of it the client's
# (measured: docs/performance.md, stop 29). `pipeline_version` is not fetched at all: the query
# fixes it. The separator cannot occur in the first four (a device id matches ID_PATTERN of
# schemas/events.py, a codec is FFmpeg's name, split and verdict are the code's words); the
# labels, free text from the container, come last and keep whatever they hold (the split stops
# at the fourth one).
PACKED_HEADS = ("split", "verdict", "device_id", "codec", "stream_labels")
PACKED_HEADS_COLUMN = "packed_heads"
HEADS_SEPARATOR = "\x1f"  # ASCII unit separator
FETCHED_HEADS = tuple(c for c in HEAD_COLUMNS if c not in (*PACKED_HEADS, "pipeline_version"))


class ExposureBounds(BaseModel):
    """What `--exposure-ok` accepts of every clip (`EGOLINE_CURATION_*`, stored in the filter
    so the manifest says which bounds it was built with)."""

    model_config = ConfigDict(frozen=True)

    max_highlights: float = Field(ge=0, le=1, description="mean clipped-highlight fraction")
    max_shadows: float = Field(ge=0, le=1, description="mean crushed-shadow fraction")
    min_mean_luma: float = Field(ge=0, le=255)
    max_mean_luma: float = Field(ge=0, le=255)

    @classmethod
    def of(cls, curation: CurationSettings) -> ExposureBounds:
        return cls(
            max_highlights=curation.max_highlights,
            max_shadows=curation.max_shadows,
            min_mean_luma=curation.min_mean_luma,
            max_mean_luma=curation.max_mean_luma,
        )


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
        default=None, ge=0, description="min quality: at most N validation warnings"
    )
    min_height: int | None = Field(default=None, ge=0, description="min quality: rows >= N px")
    tags: list[str] = Field(default_factory=list, description="episodes carrying all these tags")
    streams: list[str] = Field(
        default_factory=list, description="episodes holding all these streams (depth, wrist...)"
    )
    max_jitter_s: float | None = Field(default=None, ge=0, description="worst frame jitter")
    max_frame_gap_s: float | None = Field(default=None, ge=0, description="largest frame gap")
    max_drift_ppm: float | None = Field(default=None, ge=0, description="worst |rate drift|")
    max_camera_skew_s: float | None = Field(default=None, ge=0, description="|camera skew|")
    max_imu_skew_s: float | None = Field(default=None, ge=0, description="|IMU start skew|")
    min_imu_rate_hz: float | None = Field(default=None, ge=0, description="IMU at least this")
    exclude_salvaged: bool = Field(default=False, description="leave out files cut mid-write")
    # Content quality: an episode is kept when every clip passes (its worst clip's value,
    # `manifest_episodes.min_sharpness`...); an episode any of whose clips lacks the value
    # (older shards; no IMU for motion) is left out by a filter on it.
    min_sharpness: float | None = Field(default=None, ge=0, description="variance of Laplacian")
    max_frozen_fraction: float | None = Field(default=None, ge=0, le=1)
    exposure_ok: ExposureBounds | None = Field(
        default=None, description="every clip within these exposure bounds"
    )
    min_motion: float | None = Field(
        default=None, ge=0, description="gyro RMS, rad/s; clips without IMU fail it"
    )
    exclude_duplicates: bool = Field(
        default=False, description="leave out exact and near duplicates of earlier episodes"
    )
    # Layers (docs/warehouse.md): kind -> version, joined in the same query; `latest` is
    # resolved to a concrete version before the query is built (build.py), so the filter a
    # manifest stores names the versions it read.
    layers: dict[str, str] = Field(default_factory=dict, description="layer kind -> version")
    label_contains: list[str] = Field(
        default_factory=list,
        description="episodes with a label (of the pinned labels version) containing each, "
        "case-insensitively",
    )

    @field_validator("layers")
    @classmethod
    def _known_kinds(cls, layers: dict[str, str]) -> dict[str, str]:
        kinds = {k.value for k in LayerKind}
        unknown = sorted(set(layers) - kinds)
        if unknown:
            raise ValueError(f"no layer kind {', '.join(unknown)} (kinds: {', '.join(kinds)})")
        return dict(sorted(layers.items()))  # one order: the stored filter is canonical


KeyRange = tuple[str | None, str | None]

# `--label-contains`: the episode has a label of the pinned version containing the text.
LABEL_CONTAINS = (
    "EXISTS (SELECT 1 FROM layer_labels l WHERE l.version = {version} "
    "AND l.episode_id = m.episode_id AND strpos(lower(l.text), lower({task})) > 0)"
)

# The layer columns a manifest carries when the layer is pinned, one value per episode:
# `calibration`, a JSON object camera -> its calibration (the episode's own row for a camera,
# else the device's row whose validity window holds the episode's start, the latest window
# first); `labels`, a JSON array of the episode's labelled spans in time order. JSON text from
# Postgres's jsonb output (one canonical form for equal values). Null: nothing in the layer.
LAYER_JOINS: dict[str, tuple[str, str]] = {
    LayerKind.CALIBRATION.value: (
        "calibration",
        """LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(x.camera, x.params)::text AS calibration
    FROM (
        SELECT DISTINCT ON (c.camera) c.camera, c.params
        FROM layer_calibration c
        WHERE c.version = {version}
          AND (c.episode_id = m.episode_id
               OR (c.device_id = m.device_id
                   AND (c.valid_from IS NULL OR c.valid_from <= m.started_at)
                   AND (c.valid_until IS NULL OR m.started_at < c.valid_until)))
        ORDER BY c.camera, c.episode_id IS NULL, c.valid_from DESC NULLS LAST
    ) x
) calibration ON true""",
    ),
    LayerKind.LABELS.value: (
        "labels",
        """LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'type', l.label_type, 'start_s', l.start_s, 'end_s', l.end_s, 'text', l.text
           ) ORDER BY l.row_no)::text AS labels
    FROM layer_labels l
    WHERE l.version = {version} AND l.episode_id = m.episode_id
) labels ON true""",
    ),
}


Part = Literal["all", "heads", "bodies"]


def build_query(
    flt: ManifestFilter, key_range: KeyRange = (None, None), part: Part = "all"
) -> tuple[str, list[object]]:
    """The manifest SQL and its positional parameters.

    `part` selects the columns: `all`, the query a manifest records (one row per episode with
    every column); `heads` and `bodies`, the build's two passes over the same rows in the same
    order (services/manifest/explode.py HEAD_COLUMNS, BODY_COLUMNS; the layer columns are
    heads).

    `key_range` (first episode id included, last excluded; None: open) restricts the same query
    to a slice of the primary key, so the build can run slices on parallel connections and
    concatenate them in key order: the rows are those of the whole query, in the same order.
    """
    params: list[object] = []

    def bind(value: object) -> str:
        params.append(value)
        return f"${len(params)}"

    where = [f"m.pipeline_version = {bind(flt.pipeline_version)}"]
    if flt.verdicts:
        where.append(f"m.verdict = ANY({bind(list(flt.verdicts))}::text[])")
    if flt.started_from is not None:
        where.append(f"m.started_at >= {bind(flt.started_from)}")
    if flt.started_before is not None:
        where.append(f"m.started_at < {bind(flt.started_before)}")
    if flt.devices:
        where.append(f"m.device_id = ANY({bind(list(flt.devices))}::text[])")
    if flt.splits:
        where.append(f"m.split = ANY({bind(list(flt.splits))}::text[])")
    if flt.max_warnings is not None:
        where.append(f"m.warning_count <= {bind(flt.max_warnings)}")
    if flt.min_height is not None:
        where.append(f"m.height >= {bind(flt.min_height)}")
    if flt.tags:
        where.append(f"m.tags @> {bind(sorted(set(flt.tags)))}::varchar[]")
    if flt.streams:
        where.append(
            f"string_to_array(m.stream_labels, ',') @> {bind(sorted(set(flt.streams)))}::text[]"
        )
    bounds = (
        ("max_jitter_s", "<=", flt.max_jitter_s),
        ("max_frame_gap_s", "<=", flt.max_frame_gap_s),
        ("max_drift_ppm", "<=", flt.max_drift_ppm),
        ("camera_skew_s", "<=", flt.max_camera_skew_s),
        ("imu_skew_s", "<=", flt.max_imu_skew_s),
        ("imu_rate_hz", ">=", flt.min_imu_rate_hz),
    )
    for column, op, value in bounds:
        if value is not None:
            where.append(f"m.{column} {op} {bind(float(value))}::float8")
    if flt.exclude_salvaged:
        where.append("NOT m.salvaged")
    exposure = flt.exposure_ok
    quality = (
        ("min_sharpness", ">=", flt.min_sharpness),
        ("max_frozen_fraction", "<=", flt.max_frozen_fraction),
        ("max_highlights", "<=", exposure.max_highlights if exposure else None),
        ("max_shadows", "<=", exposure.max_shadows if exposure else None),
        ("min_mean_luma", ">=", exposure.min_mean_luma if exposure else None),
        ("max_mean_luma", "<=", exposure.max_mean_luma if exposure else None),
        ("min_motion", ">=", flt.min_motion),
    )
    for column, op, value in quality:
        if value is not None:  # a null column compares as unknown: the episode is left out
            where.append(f"m.{column} {op} {bind(float(value))}::float8")
    if flt.exclude_duplicates:
        where.append("m.duplicate_of IS NULL")
    joins, layer_columns = [], []
    for kind, version in flt.layers.items() if part != "bodies" else ():
        if version == LATEST:
            raise ValueError(f"--layer {kind}=latest must be resolved before the query is built")
        column, join = LAYER_JOINS[kind]
        joins.append(join.format(version=bind(version)))
        layer_columns.append(f"{column}.{column}")
    if flt.label_contains:
        labels = flt.layers.get(LayerKind.LABELS.value)
        if labels is None:
            raise ValueError("--label-contains needs a labels layer (--layer labels=V)")
        version = bind(labels)
        for task in flt.label_contains:  # placeholders only: the values are bound
            where.append(LABEL_CONTAINS.format(version=version, task=bind(task)))
    low, high = key_range
    if low is not None:
        where.append(f"m.episode_id >= {bind(low)}")
    if high is not None:
        where.append(f"m.episode_id < {bind(high)}")
    selected = {
        "all": COLUMNS,
        "heads": ",\n".join([*(f"    m.{name}" for name in FETCHED_HEADS), _packed_heads()]),
        "bodies": ",\n".join(f"    m.{name}" for name in BODY_COLUMNS),
    }[part]
    columns = ",\n".join([selected, *(f"    {c}" for c in layer_columns)])
    sql = (
        f"SELECT {columns}\nFROM manifest_episodes m\n"
        + "".join(f"{join}\n" for join in joins)
        + "WHERE "
        + "\n  AND ".join(where)
        + "\nORDER BY m.pipeline_version, m.episode_id"
    )
    return sql, params


def _packed_heads() -> str:
    # `||`, not concat(): measured cheaper (concat's variadic call and length() cost Postgres
    # more than the fields it saves). Every packed column is NOT NULL.
    joined = f" || chr({ord(HEADS_SEPARATOR)}) || ".join(f"m.{name}" for name in PACKED_HEADS)
    return f"    ({joined}) AS {PACKED_HEADS_COLUMN}"


# The planner's histogram of episode ids (from ANALYZE; autovacuum keeps it current).
HISTOGRAM_SQL = (
    "SELECT histogram_bounds::text::text[] FROM pg_stats "
    "WHERE tablename = 'manifest_episodes' AND attname = 'episode_id'"
)


def split_points(histogram: list[str] | None, parts: int) -> list[str]:
    """Episode ids cutting the rows into `parts` slices of about equal size, from the planner's
    histogram (free: no scan). Only balance depends on them, never the result."""
    if not histogram or parts < 2 or len(histogram) < parts + 1:
        return []
    step = (len(histogram) - 1) / parts
    points = [histogram[round(step * i)] for i in range(1, parts)]
    return sorted(set(points))


def key_ranges(points: list[str]) -> list[KeyRange]:
    bounds: list[str | None] = [None, *points, None]
    return list(itertools.pairwise(bounds))
