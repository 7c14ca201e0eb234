"""manifest_episodes: an episode's fixed-width facts as one record; a covering index for heads

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 10:20:00

A `facts` column holds the thirteen numbers the manifest repeats on each of an episode's clips
(started_at, warning_count, width, height, fps, clip_count, stream_count, the six timing
figures) as one 84-byte big-endian record (services/metadata/packing.py): Postgres formats and
ADBC parses each field of each row, and as separate fields these cost more than the packed
clips. The columns stay for filters. ix_manifest_episodes_heads covers the manifest build's
first pass over episode heads (pipeline version, episode id and what the pass reads), so that
pass reads the index, not the table. Every row is recomputed to fill `facts` (at the head
revision: services/metadata/derived.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A derived table: empty it (recomputed at the head revision, services/metadata/derived.py,
    # which fills `facts` with the statement the metadata service runs), add the column.
    from services.metadata.derived import empty_and_mark_stale

    empty_and_mark_stale(op.get_bind())
    op.add_column("manifest_episodes", sa.Column("facts", postgresql.BYTEA(), nullable=False))
    op.create_index(
        "ix_manifest_episodes_heads",
        "manifest_episodes",
        ["pipeline_version", "episode_id"],
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
    )


def downgrade() -> None:
    op.drop_index("ix_manifest_episodes_heads", "manifest_episodes")
    op.drop_column("manifest_episodes", "facts")
