"""layers: versioned calibration and label layers, and the layer versions a manifest pinned

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 22:40:00

`layer_versions` (one row per kind and version: digest, author, source, ingest order),
`layer_calibration` and `layer_labels` (the rows of each version), and `manifests.layers` (the
versions a manifest was built with). Nothing existing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "layer_versions",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=True), nullable=False, unique=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(256), nullable=False),
        sa.Column("source", sa.String(1024), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_table(
        "layer_calibration",
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("row_no", sa.Integer(), primary_key=True),
        sa.Column("episode_id", sa.String(128)),
        sa.Column("device_id", sa.String(128)),
        sa.Column("valid_from", sa.DateTime(timezone=True)),
        sa.Column("valid_until", sa.DateTime(timezone=True)),
        sa.Column("camera", sa.String(32), nullable=False),
        sa.Column("params", postgresql.JSONB(), nullable=False),
    )
    op.create_index("ix_layer_calibration_episode", "layer_calibration", ["version", "episode_id"])
    op.create_index(
        "ix_layer_calibration_device", "layer_calibration", ["version", "device_id", "valid_from"]
    )
    op.create_table(
        "layer_labels",
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("row_no", sa.Integer(), primary_key=True),
        sa.Column("episode_id", sa.String(128), nullable=False),
        sa.Column("label_type", sa.String(16), nullable=False),
        sa.Column("start_s", sa.Float(), nullable=False),
        sa.Column("end_s", sa.Float(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
    )
    op.create_index("ix_layer_labels_episode", "layer_labels", ["version", "episode_id"])
    op.add_column(
        "manifests",
        sa.Column("layers", postgresql.JSONB(), nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    op.drop_column("manifests", "layers")
    op.drop_table("layer_labels")
    op.drop_table("layer_calibration")
    op.drop_table("layer_versions")
