"""Warehouse tables (SQLAlchemy Core), the connection factory and the migrations (Alembic)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Engine,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    create_engine,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, REAL

from services.common.settings import Settings
from services.metadata.packing import FACTS_COLUMN, PACKED_COLUMN, TIMING_FIELDS

metadata = MetaData()

devices = Table(
    "devices",
    metadata,
    Column("device_id", String(128), primary_key=True),
    Column("first_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# status_rank only moves forward: uploaded 1 < decoded 2 < validated 3 < sharded 4; the
# terminal rejections (rejected, dead_lettered) rank 5 so a late event never resurrects them.
episodes = Table(
    "episodes",
    metadata,
    Column("episode_id", String(128), primary_key=True),
    Column("device_id", String(128), ForeignKey("devices.device_id"), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("split", String(16), nullable=False),
    Column("tags", ARRAY(String(64)), nullable=False, server_default="{}"),
    Column("status", String(32), nullable=False),
    Column("status_rank", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_episodes_device", "device_id"),
    Index("ix_episodes_started", "started_at"),
    Index("ix_episodes_session", "session_id"),
    # the corpus view (services/stack/corpus.py): the latest episodes to reach a status
    Index("ix_episodes_status_updated", "status", "updated_at"),
)

pipeline_versions = Table(
    "pipeline_versions",
    metadata,
    Column("pipeline_version", String(64), primary_key=True),
    Column("first_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_seen", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

raw_objects = Table(
    "raw_objects",
    metadata,
    Column("object_key", String(1024), primary_key=True),
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Index("ix_raw_objects_sha256", "sha256"),  # exact duplicates: the same bytes again
)

# Time integrity per episode (seconds, ppm, Hz; 0 when not applicable): the worst video stream's
# frame-interval jitter, largest frame gap and |rate drift|, the largest |start skew| of another
# camera against the main one, the IMU's |start skew| and its measured rate.
TIMING_COLUMNS = TIMING_FIELDS

# A clip's content signals (`ClipQuality`, migration 0006; null from older shards): median
# sharpness (variance of the Laplacian), mean luma (0-255), mean clipped-highlight and
# crushed-shadow fractions, frozen and blocked shares of its time, gyro RMS (rad/s; null: no IMU).
CLIP_QUALITY_COLUMNS = (
    "sharpness",
    "mean_luma",
    "highlights",
    "shadows",
    "frozen_fraction",
    "blocked_fraction",
    "motion",
)
# Their worst value over an episode's clips, in `manifest_episodes` (what the manifest filters
# compare; null when any clip lacks the value, so a filter on it leaves the episode out).
EPISODE_QUALITY_COLUMNS = (
    "min_sharpness",
    "max_frozen_fraction",
    "max_highlights",
    "max_shadows",
    "min_mean_luma",
    "max_mean_luma",
    "min_motion",
)

decode_meta = Table(
    "decode_meta",
    metadata,
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("pipeline_version", String(64), primary_key=True),
    Column("event_id", String(32), nullable=False),
    Column("container_format", String(64), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("codec", String(32), nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("fps", Float, nullable=False),
    Column("frame_count", Integer, nullable=False),
    Column("keyframe_count", Integer, nullable=False),
    Column("streams", JSONB, nullable=False),
    Column("cameras", JSONB, nullable=False, server_default="[]"),
    Column("audio_streams", JSONB, nullable=False, server_default="[]"),
    Column("imu", JSONB),
    Column("salvaged_s", Float),
    Column("stream_labels", String(512), nullable=False, server_default="main"),
    Column("stream_count", Integer, nullable=False, server_default="1"),
    *(Column(name, Float, nullable=False, server_default="0") for name in TIMING_COLUMNS),
)

verdicts = Table(
    "verdicts",
    metadata,
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("pipeline_version", String(64), primary_key=True),
    Column("event_id", String(32), nullable=False),
    Column("verdict", String(32), nullable=False),
    Column("reasons", JSONB, nullable=False),
    Column("warnings", JSONB, nullable=False),
)

shards = Table(
    "shards",
    metadata,
    Column("shard_key", String(1024), primary_key=True),
    Column("index_key", String(1024), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("clip_count", Integer, nullable=False),
    Column("pipeline_version", String(64), nullable=False),
    Column("event_id", String(32), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

clips = Table(
    "clips",
    metadata,
    Column("clip_key", String(256), primary_key=True),
    Column("pipeline_version", String(64), primary_key=True),
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), nullable=False),
    Column("shard_key", String(1024), ForeignKey("shards.shard_key"), nullable=False),
    Column("clip_index", Integer, nullable=False),
    Column("start_s", Float, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("frame_count", Integer, nullable=False),
    Column("mp4_offset", BigInteger, nullable=False),
    Column("mp4_length", BigInteger, nullable=False),
    Column("imu_offset", BigInteger),
    Column("imu_length", BigInteger),
    Column("json_offset", BigInteger, nullable=False),
    Column("json_length", BigInteger, nullable=False),
    Column("members", JSONB, nullable=False, server_default="[]"),
    *(Column(name, Float) for name in CLIP_QUALITY_COLUMNS),
    Index("ix_clips_episode", "episode_id"),
    Index("ix_clips_shard", "shard_key"),
)

# What a manifest reads: one row per (pipeline version, episode) with clips, holding the
# episode's facts joined once and its clips packed into one bytea of fixed-size records
# (services/metadata/packing.py). Derived from the tables above by the metadata service in the
# same transaction as the events that touch it, so it is never ahead of or behind them; a
# manifest is then one index-ordered scan of this table, not a five-way join over clips.
manifest_episodes = Table(
    "manifest_episodes",
    metadata,
    Column("pipeline_version", String(64), primary_key=True),
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("device_id", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("split", String(16), nullable=False),
    Column("tags", ARRAY(String(64)), nullable=False),
    Column("verdict", String(32), nullable=False),
    Column("warning_count", Integer, nullable=False),
    Column("codec", String(32), nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("fps", Float, nullable=False),
    Column("raw_key", String(1024), nullable=False),
    Column("raw_sha256", String(64), nullable=False),
    Column("clip_count", Integer, nullable=False),
    Column("shard_keys", ARRAY(String(1024)), nullable=False),
    Column(PACKED_COLUMN, BYTEA, nullable=False),
    Column(FACTS_COLUMN, BYTEA, nullable=False),
    Column("stream_labels", String(512), nullable=False, server_default="main"),
    Column("stream_count", Integer, nullable=False, server_default="1"),
    Column("salvaged", Boolean, nullable=False, server_default="false"),
    *(Column(name, Float, nullable=False, server_default="0") for name in TIMING_COLUMNS),
    *(Column(name, Float) for name in EPISODE_QUALITY_COLUMNS),
    Column("duplicate_of", String(128)),
    Column("duplicate_kind", String(8)),
    Index("ix_manifest_episodes_started", "pipeline_version", "started_at"),
    Index("ix_manifest_episodes_device", "pipeline_version", "device_id"),
    Index("ix_manifest_episodes_tags", "tags", postgresql_using="gin"),
    # Covers the manifest build's first pass over episode heads: an index-only scan.
    Index(
        "ix_manifest_episodes_heads",
        "pipeline_version",
        "episode_id",
        postgresql_include=[
            "session_id",
            "raw_key",
            "raw_sha256",
            "clip_count",
            "verdict",
            "split",
            "duplicate_of",
            "device_id",
            "codec",
            "stream_labels",
        ],
    ),
)

# Content signals summarized per episode and pipeline version (from `EpisodeValidated.signals`),
# Each episode's announcement as uploaded (its EpisodeRef), the latest one: what `egoline
# backfill` re-announces with a new pipeline version.
episode_refs = Table(
    "episode_refs",
    metadata,
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("ref", JSONB, nullable=False),
    Column("event_id", String(32), nullable=False),
)

# with its signature: the informative frames' 64-bit pHashes as signed bigints, in frame order
# (services/metadata/duplicates.py).
episode_quality = Table(
    "episode_quality",
    metadata,
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("pipeline_version", String(64), primary_key=True),
    Column("signals_version", Integer, nullable=False),
    Column("sample_s", Float, nullable=False),
    Column("frames", Integer, nullable=False),
    Column("informative_frames", Integer, nullable=False),
    Column("min_sharpness", Float),
    Column("median_sharpness", Float),
    Column("max_highlights", Float),
    Column("max_shadows", Float),
    Column("still_s", Float, nullable=False),
    Column("phashes", ARRAY(BigInteger), nullable=False),
)

# The near-duplicate index: each informative frame hash cut into 4 bands of 16 bits, one row per
# band; the btree finds a (band, value) and carries the whole hash, so a candidate's distance is
# checked in the index (multi-index hashing: services/metadata/duplicates.py).
phash_bands = Table(
    "phash_bands",
    metadata,
    Column("pipeline_version", String(64), nullable=False),
    Column("band", SmallInteger, nullable=False),
    Column("value", Integer, nullable=False),
    Column("phash", BigInteger, nullable=False),
    Column("episode_id", String(128), nullable=False),
    Column("frame", SmallInteger, nullable=False),
    Index(
        "ix_phash_bands_lookup",
        "pipeline_version",
        "band",
        "value",
        postgresql_include=["phash", "episode_id"],
    ),
    Index("ix_phash_bands_episode", "episode_id", "pipeline_version"),
)

# Pairs of near-duplicate episodes: `episode_id` is the later (started_at, then id), the one a
# manifest with --exclude-duplicates drops; the evidence is the share of the shorter signature
# matched, its length and the closest two hashes.
near_duplicates = Table(
    "near_duplicates",
    metadata,
    Column("pipeline_version", String(64), primary_key=True),
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("duplicate_of", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("shared", Float, nullable=False),
    Column("frames", Integer, nullable=False),
    Column("min_distance", SmallInteger, nullable=False),
    Index("ix_near_duplicates_of", "pipeline_version", "duplicate_of"),
)

# The IMU signature (migration 0010; services/sensors/imu_signature.py): each episode's gyro
# magnitude smoothed at `rate_hz` (rad/s, value i at start_s + i / rate_hz on its video clock),
# its landmark index (hash -> anchor time, episode: the btree carries both), and the pairs the
# IMU finds, the later episode first, with their evidence (services/metadata/imu_duplicates.py).
imu_signatures = Table(
    "imu_signatures",
    metadata,
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("pipeline_version", String(64), primary_key=True),
    Column("signature_version", Integer, nullable=False),
    Column("rate_hz", Float, nullable=False),
    Column("start_s", Float, nullable=False),
    Column("span_s", Float, nullable=False),
    Column("peaks", Integer, nullable=False),
    Column("landmarks", Integer, nullable=False),
    Column("gyro", ARRAY(REAL), nullable=False),
)

imu_landmarks = Table(
    "imu_landmarks",
    metadata,
    Column("pipeline_version", String(64), nullable=False),
    Column("hash", BigInteger, nullable=False),
    Column("t_s", Float, nullable=False),
    Column("episode_id", String(128), nullable=False),
    Index(
        "ix_imu_landmarks_lookup",
        "pipeline_version",
        "hash",
        postgresql_include=["t_s", "episode_id"],
    ),
    Index("ix_imu_landmarks_episode", "episode_id", "pipeline_version"),
)

imu_duplicates = Table(
    "imu_duplicates",
    metadata,
    Column("pipeline_version", String(64), primary_key=True),
    Column("episode_id", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("duplicate_of", String(128), ForeignKey("episodes.episode_id"), primary_key=True),
    Column("votes", Integer, nullable=False),
    Column("lag_s", Float, nullable=False),
    Column("correlation", Float, nullable=False),
    Column("overlap_s", Float, nullable=False),
    Index("ix_imu_duplicates_of", "pipeline_version", "duplicate_of"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("event_id", String(32), primary_key=True),
    Column("stage", String(32), nullable=False),
    Column("source_topic", String(255), nullable=False),
    Column("reason_code", String(64), nullable=False),
    Column("reason", Text, nullable=False),
    Column("episode_id", String(128)),
    Column("failed_at", DateTime(timezone=True), nullable=False),
)

processed_events = Table(
    "processed_events",
    metadata,
    Column("event_id", String(32), primary_key=True),
    Column("topic", String(255), nullable=False),
    Column("processed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

manifests = Table(
    "manifests",
    metadata,
    Column("manifest_id", String(64), primary_key=True),
    Column("object_key", String(1024), nullable=False),
    Column("query", Text, nullable=False),
    Column("params", JSONB, nullable=False),
    Column("row_count", BigInteger, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The layer versions the manifest pinned, resolved ({"calibration": "v3"}; migration 0009).
    Column("layers", JSONB, nullable=False, server_default="{}"),
)

# Layers (migration 0009): versioned data attached to episodes after ingestion. A version is
# written whole, once (a file in one transaction, or one `episodes.annotated` event) and never
# changes: `digest` is the sha256 of its canonical rows (services/metadata/layers.py), and a
# second write of the version is a no-op with the same digest, refused with another. `seq`
# orders versions as they were ingested: `latest` is a kind's highest.
layer_versions = Table(
    "layer_versions",
    metadata,
    Column("kind", String(32), primary_key=True),
    Column("version", String(64), primary_key=True),
    Column("seq", BigInteger, Identity(always=True), nullable=False, unique=True),
    Column("digest", String(64), nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("author", String(256), nullable=False),
    Column("source", String(1024), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Calibration rows: one camera of one episode, or of a device over [valid_from, valid_until)
# (null: open). `params` is the camera's calibration as the manifest carries it (JSON:
# width, height, fx, fy, cx, cy in px, distortion_model, distortion, extrinsics 4x4 row-major
# camera-to-rig in metres). `row_no` is the row's place in the version's canonical order.
layer_calibration = Table(
    "layer_calibration",
    metadata,
    Column("version", String(64), primary_key=True),
    Column("row_no", Integer, primary_key=True),
    Column("episode_id", String(128)),
    Column("device_id", String(128)),
    Column("valid_from", DateTime(timezone=True)),
    Column("valid_until", DateTime(timezone=True)),
    Column("camera", String(32), nullable=False),
    Column("params", JSONB, nullable=False),
    Index("ix_layer_calibration_episode", "version", "episode_id"),
    Index("ix_layer_calibration_device", "version", "device_id", "valid_from"),
)

# Label rows: a time span of an episode (seconds on the episode clock) with its type (label,
# subtask, instruction, caption) and text.
layer_labels = Table(
    "layer_labels",
    metadata,
    Column("version", String(64), primary_key=True),
    Column("row_no", Integer, primary_key=True),
    Column("episode_id", String(128), nullable=False),
    Column("label_type", String(16), nullable=False),
    Column("start_s", Float, nullable=False),
    Column("end_s", Float, nullable=False),
    Column("text", Text, nullable=False),
    Index("ix_layer_labels_episode", "version", "episode_id"),
)

# Reverse lineage (migration 0010; docs/warehouse.md "Reverse lineage"). One row per manifest
# whose membership is indexed: a small surrogate number (the member rows carry 4 bytes, not the
# 64-character id), its family (successive versions of one dataset: the held-out check compares
# a manifest with the others of its family), the pipeline version it was built for and the
# layer versions it pins (resolved at build, as `manifests.layers`; from the file's schema
# metadata when indexed from it).
indexed_manifests = Table(
    "indexed_manifests",
    metadata,
    Column("manifest_no", Integer, primary_key=True),
    Column(
        "manifest_id",
        String(64),
        ForeignKey("manifests.manifest_id"),
        nullable=False,
        unique=True,
    ),
    Column("family", String(128)),
    Column("pipeline_version", String(64), nullable=False),
    Column("layer_versions", JSONB, nullable=False, server_default="{}"),
    Column("episode_count", BigInteger, nullable=False),
    Column("clip_count", BigInteger, nullable=False),
    Column("source", String(16), nullable=False),  # build | file (`egoline manifest index`)
    Column("indexed_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_indexed_manifests_family", "family"),
)

# Which episodes (and which of their clips) each indexed manifest holds: one row per (manifest,
# episode), the clips as a bitmap (bit i % 8 of byte i // 8, least significant first: clip
# index i is in the manifest; services/manifest/members.py) and the split the manifest gave the
# episode. Partitioned by manifest: each manifest's rows are one partition
# (`manifest_members_<manifest_no>`), COPYed while the build writes the file, then indexed on
# the episode in one sorted pass and attached. Maintaining one btree over every manifest's rows
# instead cost 3-11 s per 1M rows on this machine (its keys interleave with every earlier
# manifest's), a fresh partition's COPY + CREATE INDEX 1.8-2.8 s; a lookup probes each
# partition's index (docs/warehouse.md "Reverse lineage"). No foreign key: the rows are written
# in the transaction that records their `indexed_manifests` row and dropped with it.
manifest_members = Table(
    "manifest_members",
    metadata,
    Column("manifest_no", Integer, nullable=False),
    Column("episode_id", String(128), nullable=False),
    Column("split", String(16), nullable=False),
    Column("clips", BYTEA, nullable=False),
    postgresql_partition_by="LIST (manifest_no)",
)

# Training runs and the manifests they read (`egoline runs register`, or the reader given a run
# name): one row per (run, manifest), the first registration kept.
training_runs = Table(
    "training_runs",
    metadata,
    Column("run_name", String(256), primary_key=True),
    Column("manifest_id", String(64), ForeignKey("manifests.manifest_id"), primary_key=True),
    Column("registered_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("host", String(256), nullable=False),
    Column("username", String(128), nullable=False),
    Column("note", Text, nullable=False, server_default=""),
    Index("ix_training_runs_manifest", "manifest_id"),
)


def make_engine(settings: Settings) -> Engine:
    return create_engine(settings.database_sqlalchemy_url, pool_pre_ping=True)


MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", settings.database_sqlalchemy_url)
    return config


def upgrade(
    settings: Settings, revision: str = "head", progress: Callable[[int], None] | None = None
) -> None:
    """Apply the Alembic migrations up to `revision` (idempotent). At the head revision, the
    derived `manifest_episodes` is recomputed if a migration emptied it (services/metadata/
    derived.py; `progress` gets the episodes done so far)."""
    config = alembic_config(settings)
    command.upgrade(config, revision)
    if revision != "head":
        return
    from services.metadata.derived import recompute_if_stale

    engine = make_engine(settings)
    try:
        with engine.begin() as conn:
            recompute_if_stale(conn, progress)
    finally:
        engine.dispose()
