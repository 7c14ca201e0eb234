"""repack manifest_episodes: clip member lengths as 32-bit values

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 22:50:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The packed layout (services/manifest/packing.py) changed: recompute every row from the
    # normalized tables, the statement the metadata service runs.
    from services.metadata.core import refresh_all_manifest_episodes

    for _ in refresh_all_manifest_episodes(op.get_bind()):
        pass


def downgrade() -> None:
    pass  # rows are recomputed by the service from the normalized tables either way
