"""reverse lineage: indexed manifests (family, layer versions), their member episodes and clips,
and the training runs that read them

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 22:40:00

Manifests built before this revision have no member rows: `egoline lineage --used-by` does not
list them until `egoline manifest index M` reads their file and records them (docs/warehouse.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "indexed_manifests",
        sa.Column("manifest_no", sa.Integer(), primary_key=True),
        sa.Column(
            "manifest_id",
            sa.String(64),
            sa.ForeignKey("manifests.manifest_id"),
            nullable=False,
            unique=True,
        ),
        sa.Column("family", sa.String(128)),
        sa.Column("pipeline_version", sa.String(64), nullable=False),
        sa.Column(
            "layer_versions", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'")
        ),
        sa.Column("episode_count", sa.BigInteger(), nullable=False),
        sa.Column("clip_count", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column(
            "indexed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_indexed_manifests_family", "indexed_manifests", ["family"])
    op.create_table(
        "manifest_members",
        sa.Column("manifest_no", sa.Integer(), nullable=False),
        sa.Column("episode_id", sa.String(128), nullable=False),
        sa.Column("split", sa.String(16), nullable=False),
        sa.Column("clips", postgresql.BYTEA(), nullable=False),
        postgresql_partition_by="LIST (manifest_no)",
    )
    op.create_table(
        "training_runs",
        sa.Column("run_name", sa.String(256), primary_key=True),
        sa.Column(
            "manifest_id", sa.String(64), sa.ForeignKey("manifests.manifest_id"), primary_key=True
        ),
        sa.Column(
            "registered_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("username", sa.String(128), nullable=False),
        sa.Column("note", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index("ix_training_runs_manifest", "training_runs", ["manifest_id"])


def downgrade() -> None:
    op.drop_table("training_runs")
    op.drop_table("manifest_members")  # and its partitions
    op.drop_table("indexed_manifests")
