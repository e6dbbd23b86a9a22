"""Queue: the QUEUED status among the active ones (deployments waiting for room); the partial
index of active deployments is made again with it.

Revision ID: queue
Revises: scaling
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "queue"
down_revision = "scaling"
branch_labels = None
depends_on = None

# The active statuses, as store/deployments.py writes them into its queries (tables.py).
ACTIVE = "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'QUEUED', 'REQUESTED', 'UNLOADED')"
ACTIVE_BEFORE = "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'REQUESTED', 'UNLOADED')"


def _active_index(predicate: str) -> None:
    op.drop_index("ix_deployments_active", table_name="deployments")
    op.create_index(
        "ix_deployments_active",
        "deployments",
        ["requested_at", "id"],
        sqlite_where=sa.text(predicate),
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    _active_index(ACTIVE)


def downgrade() -> None:
    # Queued deployments were never placed: they end as stopped, which the old code knows.
    op.execute(
        "UPDATE deployments SET status = 'STOPPED', stopped_at = CURRENT_TIMESTAMP "
        "WHERE status = 'QUEUED'"
    )
    _active_index(ACTIVE_BEFORE)
