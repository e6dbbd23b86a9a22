"""Indexes for the deployment reads that run per request: the gateway's routing by served
name (model_name, status), the newest-first pages of ended deployments (requested_at), and
the few active deployments among many ended ones (a partial index; its size also tells the
planner how few they are, which SQLite cannot learn from the status index alone).

Revision ID: deployment_indexes
Revises: api_tokens
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "deployment_indexes"
down_revision = "api_tokens"
branch_labels = None
depends_on = None

# The active statuses, as store/deployments.py writes them into its queries.
ACTIVE = "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'REQUESTED')"


def upgrade() -> None:
    op.create_index("ix_deployments_model_name_status", "deployments", ["model_name", "status"])
    op.create_index("ix_deployments_requested_at", "deployments", ["requested_at", "id"])
    op.create_index(
        "ix_deployments_active",
        "deployments",
        ["requested_at", "id"],
        sqlite_where=sa.text(ACTIVE),
        postgresql_where=sa.text(ACTIVE),
    )


def downgrade() -> None:
    op.drop_index("ix_deployments_active", table_name="deployments")
    op.drop_index("ix_deployments_requested_at", table_name="deployments")
    op.drop_index("ix_deployments_model_name_status", table_name="deployments")
