"""episodes (status, updated_at): the corpus view's latest sharded and rejected episodes

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 22:45:00

The lag service's corpus view (services/stack/corpus.py) reads the episodes that reached
`sharded` in the last day (freshness) and the latest `rejected` ones (examples). Both are a
range of `updated_at` within one status: without this index each was a scan of `episodes`.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_episodes_status_updated", "episodes", ["status", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_episodes_status_updated", table_name="episodes")
