"""IMU signature: each episode's motion descriptor, its landmark index and the pairs it finds

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 23:00:00

imu_signatures keeps each episode's IMU signature (the gyro magnitude smoothed at 10 Hz, as
decode computes it: services/sensors/imu_signature.py); imu_landmarks is its index (one row
per landmark hash with its anchor time, a btree on (pipeline version, hash) carrying the time
and the episode); imu_duplicates holds the pairs the IMU finds, later episode first, with
their evidence. Independent of the other tables: manifest_episodes' `duplicate_of` reads the
pairs when a row is recomputed (services/metadata/core.py), nothing is rewritten here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "imu_signatures",
        sa.Column(
            "episode_id", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column("pipeline_version", sa.String(64), primary_key=True),
        sa.Column("signature_version", sa.Integer(), nullable=False),
        sa.Column("rate_hz", sa.Float(), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("span_s", sa.Float(), nullable=False),
        sa.Column("peaks", sa.Integer(), nullable=False),
        sa.Column("landmarks", sa.Integer(), nullable=False),
        sa.Column("gyro", postgresql.ARRAY(sa.REAL()), nullable=False),
    )
    op.create_table(
        "imu_landmarks",
        sa.Column("pipeline_version", sa.String(64), nullable=False),
        sa.Column("hash", sa.BigInteger(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("episode_id", sa.String(128), nullable=False),
    )
    op.create_index(
        "ix_imu_landmarks_lookup",
        "imu_landmarks",
        ["pipeline_version", "hash"],
        postgresql_include=["t_s", "episode_id"],
    )
    op.create_index("ix_imu_landmarks_episode", "imu_landmarks", ["episode_id", "pipeline_version"])
    op.create_table(
        "imu_duplicates",
        sa.Column("pipeline_version", sa.String(64), primary_key=True),
        sa.Column(
            "episode_id", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column(
            "duplicate_of", sa.String(128), sa.ForeignKey("episodes.episode_id"), primary_key=True
        ),
        sa.Column("votes", sa.Integer(), nullable=False),
        sa.Column("lag_s", sa.Float(), nullable=False),
        sa.Column("correlation", sa.Float(), nullable=False),
        sa.Column("overlap_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_imu_duplicates_of", "imu_duplicates", ["pipeline_version", "duplicate_of"])


def downgrade() -> None:
    op.drop_table("imu_duplicates")
    op.drop_table("imu_landmarks")
    op.drop_table("imu_signatures")
