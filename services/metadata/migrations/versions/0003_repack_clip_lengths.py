"""repack manifest_episodes: clip member lengths as 32-bit values

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 22:50:00
"""

from __future__ import annotations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The rows are recomputed in 0004 (the packed layout changed again; the service's refresh
    # statement only fits the newest columns).
    pass


def downgrade() -> None:
    pass  # rows are recomputed by the service from the normalized tables either way
