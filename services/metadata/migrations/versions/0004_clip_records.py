"""manifest_episodes: an episode's clips as one bytea of fixed-size records

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 03:20:00

One `clips` column of 64-byte big-endian records (services/metadata/packing.py) replaces the
eleven per-field `c_*` columns: Postgres formats and ADBC parses each episode row field by field,
so the manifest query sends 17 fields a row instead of 27.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_FIELDS = (
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


def upgrade() -> None:
    # A derived table: empty it, change the layout; every row is recomputed from the normalized
    # tables with the statement the metadata service runs, at the head revision.
    from services.metadata.derived import empty_and_mark_stale

    empty_and_mark_stale(op.get_bind())  # recomputed at the head revision (derived.py)
    for field in OLD_FIELDS:
        op.drop_column("manifest_episodes", f"c_{field}")
    op.add_column("manifest_episodes", sa.Column("clips", postgresql.BYTEA(), nullable=False))


def downgrade() -> None:
    op.execute("DELETE FROM manifest_episodes")
    op.drop_column("manifest_episodes", "clips")
    for field in OLD_FIELDS:
        op.add_column(
            "manifest_episodes", sa.Column(f"c_{field}", postgresql.BYTEA(), nullable=False)
        )
    # Rows come back as the service touches episodes (or run the refresh at revision 0003).
