"""Inventory: the locations, clusters and hardware entries an admin registers.

Revision ID: inventory
Revises: model_names
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "inventory"
down_revision = "model_names"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inventory",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("fields", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_inventory_kind", "inventory", ["kind", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_inventory_kind", table_name="inventory")
    op.drop_table("inventory")
