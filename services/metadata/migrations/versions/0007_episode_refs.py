"""episode_refs: each episode's announcement (its EpisodeRef as uploaded), for backfills

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 03:45:00

`egoline backfill` re-announces episodes on `episodes.uploaded` with a new pipeline version; the
announcement (device, session, start, every raw file with its key, sha256 and size) is what it
needs, and the warehouse kept only parts of it. Episodes announced before this revision have no
row until they are announced again (a replay of `episodes.uploaded`, or the agent re-run).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "episode_refs",
        sa.Column(
            "episode_id",
            sa.String(128),
            sa.ForeignKey("episodes.episode_id"),
            primary_key=True,
        ),
        sa.Column("ref", postgresql.JSONB(), nullable=False),
        sa.Column("event_id", sa.String(32), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("episode_refs")
