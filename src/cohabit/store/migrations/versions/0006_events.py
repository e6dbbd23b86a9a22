"""Deployment events: the timeline of each deployment (requested, placed, started, …).

Revision ID: events
Revises: downloads
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "events"
down_revision = "downloads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "deployment_id",
            sa.String(36),
            sa.ForeignKey("deployments.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data", sa.JSON),
    )
    op.create_index("ix_events_deployment_id", "events", ["deployment_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_deployment_id", table_name="events")
    op.drop_table("events")
