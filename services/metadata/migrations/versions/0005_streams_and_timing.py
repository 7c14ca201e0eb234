"""every stream and camera, time integrity: probe columns, clip members, manifest filters

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 11:50:00

decode_meta keeps each episode's other cameras, audio streams, IMU summary and salvaged
duration, plus the time-integrity figures the manifest filters on (the worst stream's frame
jitter, largest frame gap and rate drift; the largest camera start skew; the IMU's start skew
and rate). clips keeps every member (video stream per camera, IMU) with its byte range.
manifest_episodes repeats the figures and the stream labels, so a manifest still reads one table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TIMING = (
    "max_jitter_s",
    "max_frame_gap_s",
    "max_drift_ppm",
    "camera_skew_s",
    "imu_skew_s",
    "imu_rate_hz",
)


def upgrade() -> None:
    jsonb = postgresql.JSONB()
    op.add_column("decode_meta", sa.Column("cameras", jsonb, nullable=False, server_default="[]"))
    op.add_column(
        "decode_meta", sa.Column("audio_streams", jsonb, nullable=False, server_default="[]")
    )
    op.add_column("decode_meta", sa.Column("imu", jsonb))
    op.add_column("decode_meta", sa.Column("salvaged_s", sa.Float()))
    op.add_column(
        "decode_meta",
        sa.Column("stream_labels", sa.String(512), nullable=False, server_default="main"),
    )
    op.add_column(
        "decode_meta", sa.Column("stream_count", sa.Integer(), nullable=False, server_default="1")
    )
    for name in TIMING:
        op.add_column(
            "decode_meta", sa.Column(name, sa.Float(), nullable=False, server_default="0")
        )
    op.add_column("clips", sa.Column("members", jsonb, nullable=False, server_default="[]"))
    # A derived table: empty it, add the columns (every row recomputed at the head revision).
    from services.metadata.derived import empty_and_mark_stale

    empty_and_mark_stale(op.get_bind())  # recomputed at the head revision (derived.py)
    op.add_column(
        "manifest_episodes",
        sa.Column("stream_labels", sa.String(512), nullable=False, server_default="main"),
    )
    op.add_column(
        "manifest_episodes",
        sa.Column("stream_count", sa.Integer(), nullable=False, server_default="1"),
    )
    op.add_column(
        "manifest_episodes",
        sa.Column("salvaged", sa.Boolean(), nullable=False, server_default="false"),
    )
    for name in TIMING:
        op.add_column(
            "manifest_episodes", sa.Column(name, sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    for name in (*TIMING, "stream_labels", "stream_count", "salvaged"):
        op.drop_column("manifest_episodes", name)
    op.drop_column("clips", "members")
    for name in (
        *TIMING,
        "cameras",
        "audio_streams",
        "imu",
        "salvaged_s",
        "stream_labels",
        "stream_count",
    ):
        op.drop_column("decode_meta", name)
