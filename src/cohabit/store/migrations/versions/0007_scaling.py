"""Scaling: a deployment's priority, keep-alive, queue flag, copies and duration (with when it
ends), when it was last used, and the UNLOADED status among the active ones (the partial
index of active deployments is made again with it).

Revision ID: scaling
Revises: events
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "scaling"
down_revision = "events"
branch_labels = None
depends_on = None

# The active statuses, as store/deployments.py writes them into its queries (tables.py).
ACTIVE = "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'REQUESTED', 'UNLOADED')"
ACTIVE_BEFORE = "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'REQUESTED')"


def _active_index(predicate: str) -> None:
    op.create_index(
        "ix_deployments_active",
        "deployments",
        ["requested_at", "id"],
        sqlite_where=sa.text(predicate),
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        # Rows from before keep what they ran with: one copy, never unloaded, no end.
        batch.add_column(sa.Column("priority", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(
            sa.Column("keep_alive_s", sa.Integer, nullable=False, server_default="300")
        )
        batch.add_column(sa.Column("queue", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("min_copies", sa.Integer, nullable=False, server_default="1"))
        batch.add_column(
            sa.Column("starting_copies", sa.Integer, nullable=False, server_default="1")
        )
        batch.add_column(sa.Column("max_copies", sa.Integer))
        batch.add_column(sa.Column("duration_min", sa.Integer))
        batch.add_column(sa.Column("ends_at", sa.DateTime(timezone=True)))
        batch.add_column(sa.Column("last_used_at", sa.DateTime(timezone=True)))
    op.drop_index("ix_deployments_active", table_name="deployments")
    _active_index(ACTIVE)


def downgrade() -> None:
    op.drop_index("ix_deployments_active", table_name="deployments")
    _active_index(ACTIVE_BEFORE)
    with op.batch_alter_table("deployments") as batch:
        for column in (
            "last_used_at",
            "ends_at",
            "duration_min",
            "max_copies",
            "starting_copies",
            "min_copies",
            "queue",
            "keep_alive_s",
            "priority",
        ):
            batch.drop_column(column)
