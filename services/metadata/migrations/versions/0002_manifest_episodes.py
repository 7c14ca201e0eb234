"""episode tags, pipeline versions, the manifest_episodes table, manifest size

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 22:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "episodes",
        sa.Column(
            "tags", postgresql.ARRAY(sa.String(length=64)), server_default="{}", nullable=False
        ),
    )
    op.create_index("ix_episodes_session", "episodes", ["session_id"])
    op.create_index("ix_clips_shard", "clips", ["shard_key"])
    op.add_column(
        "manifests",
        sa.Column("size_bytes", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.alter_column("manifests", "size_bytes", server_default=None)
    op.create_table(
        "pipeline_versions",
        sa.Column("pipeline_version", sa.String(length=64), nullable=False),
        sa.Column(
            "first_seen",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("pipeline_version"),
    )
    op.execute(
        "INSERT INTO pipeline_versions (pipeline_version) "
        "SELECT DISTINCT pipeline_version FROM decode_meta ON CONFLICT DO NOTHING"
    )
    op.create_table(
        "manifest_episodes",
        sa.Column("pipeline_version", sa.String(length=64), nullable=False),
        sa.Column("episode_id", sa.String(length=128), nullable=False),
        sa.Column("device_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("split", sa.String(length=16), nullable=False),
        sa.Column("tags", postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("warning_count", sa.Integer(), nullable=False),
        sa.Column("codec", sa.String(length=32), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("height", sa.Integer(), nullable=False),
        sa.Column("fps", sa.Float(), nullable=False),
        sa.Column("raw_key", sa.String(length=1024), nullable=False),
        sa.Column("raw_sha256", sa.String(length=64), nullable=False),
        sa.Column("clip_count", sa.Integer(), nullable=False),
        sa.Column("shard_keys", postgresql.ARRAY(sa.String(length=1024)), nullable=False),
        *(
            sa.Column(f"c_{field}", postgresql.BYTEA(), nullable=False)
            for field in (
                "byte_offset",
                "length",
                "imu_offset",
                "imu_length",
                "json_offset",
                "json_length",
                "clip_start_s",
                "clip_duration_s",
                "clip_index",
                "frame_count",
                "shard_no",
            )
        ),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.episode_id"]),
        sa.PrimaryKeyConstraint("pipeline_version", "episode_id"),
    )
    op.create_index(
        "ix_manifest_episodes_started", "manifest_episodes", ["pipeline_version", "started_at"]
    )
    op.create_index(
        "ix_manifest_episodes_device", "manifest_episodes", ["pipeline_version", "device_id"]
    )
    op.create_index(
        "ix_manifest_episodes_tags", "manifest_episodes", ["tags"], postgresql_using="gin"
    )
    # The backfill from what the warehouse already holds runs in 0004, the revision of the
    # current packed layout: the service's refresh statement only fits the newest columns.


def downgrade() -> None:
    op.drop_table("manifest_episodes")
    op.drop_table("pipeline_versions")
    op.drop_column("manifests", "size_bytes")
    op.drop_index("ix_clips_shard", table_name="clips")
    op.drop_index("ix_episodes_session", table_name="episodes")
    op.drop_column("episodes", "tags")
