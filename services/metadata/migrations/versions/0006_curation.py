"""curation: clip quality, episode signals summary, near-duplicate index, duplicate_of

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 03:20:00

clips keeps each clip's content signals (ClipQuality; null from older shards). episode_quality
summarizes an episode's sampled-frame signals and keeps its signature (the informative frames'
pHashes). phash_bands is the near-duplicate index (4 bands of 16 bits per hash, a btree on
(pipeline version, band, value) carrying the hash); near_duplicates holds the pairs found.
raw_objects gets an index on sha256 (exact duplicates). manifest_episodes repeats the worst
clip quality values, the episode's duplicate_of and its kind, and its packed clip records grow
by the clip quality values (services/metadata/packing.py), so every row is recomputed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

CLIP_QUALITY = (
    "sharpness",
    "mean_luma",
    "highlights",
    "shadows",
    "frozen_fraction",
    "blocked_fraction",
    "motion",
)
EPISODE_QUALITY = (
    "min_sharpness",
    "max_frozen_fraction",
    "max_highlights",
    "max_shadows",
    "min_mean_luma",
    "max_mean_luma",
    "min_motion",
)


def upgrade() -> None:
    for name in CLIP_QUALITY:
        op.add_column("clips", sa.Column(name, sa.Float()))
    op.create_index("ix_raw_objects_sha256", "raw_objects", ["sha256"])
    op.create_table(
        "episode_quality",
        sa.Column(
            "episode_id", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column("pipeline_version", sa.String(64), primary_key=True),
        sa.Column("signals_version", sa.Integer(), nullable=False),
        sa.Column("sample_s", sa.Float(), nullable=False),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("informative_frames", sa.Integer(), nullable=False),
        sa.Column("min_sharpness", sa.Float()),
        sa.Column("median_sharpness", sa.Float()),
        sa.Column("max_highlights", sa.Float()),
        sa.Column("max_shadows", sa.Float()),
        sa.Column("still_s", sa.Float(), nullable=False),
        sa.Column("phashes", postgresql.ARRAY(sa.BigInteger()), nullable=False),
    )
    op.create_table(
        "phash_bands",
        sa.Column("pipeline_version", sa.String(64), nullable=False),
        sa.Column("band", sa.SmallInteger(), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("phash", sa.BigInteger(), nullable=False),
        sa.Column("episode_id", sa.String(128), nullable=False),
        sa.Column("frame", sa.SmallInteger(), nullable=False),
    )
    op.create_index(
        "ix_phash_bands_lookup",
        "phash_bands",
        ["pipeline_version", "band", "value"],
        postgresql_include=["phash", "episode_id"],
    )
    op.create_index("ix_phash_bands_episode", "phash_bands", ["episode_id", "pipeline_version"])
    op.create_table(
        "near_duplicates",
        sa.Column("pipeline_version", sa.String(64), primary_key=True),
        sa.Column(
            "episode_id", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column(
            "duplicate_of", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column("shared", sa.Float(), nullable=False),
        sa.Column("frames", sa.Integer(), nullable=False),
        sa.Column("min_distance", sa.SmallInteger(), nullable=False),
    )
    op.create_index(
        "ix_near_duplicates_of", "near_duplicates", ["pipeline_version", "duplicate_of"]
    )
    # A derived table: empty it, add the columns (the records grew; recomputed at the head).
    from services.metadata.derived import empty_and_mark_stale

    empty_and_mark_stale(op.get_bind())  # recomputed at the head revision (derived.py)
    for name in EPISODE_QUALITY:
        op.add_column("manifest_episodes", sa.Column(name, sa.Float()))
    op.add_column("manifest_episodes", sa.Column("duplicate_of", sa.String(128)))
    op.add_column("manifest_episodes", sa.Column("duplicate_kind", sa.String(8)))


def downgrade() -> None:
    op.execute("DELETE FROM manifest_episodes")
    for name in (*EPISODE_QUALITY, "duplicate_of", "duplicate_kind"):
        op.drop_column("manifest_episodes", name)
    op.drop_table("near_duplicates")
    op.drop_table("phash_bands")
    op.drop_table("episode_quality")
    op.drop_index("ix_raw_objects_sha256", "raw_objects")
    for name in CLIP_QUALITY:
        op.drop_column("clips", name)
    # The records shrink back: recompute with the previous packing (that release's code).
