"""Indexes for the deployment reads that run per request: the gateway's routing by served
name (model_name, status) and the newest-first pages of ended deployments (requested_at).

Revision ID: deployment_indexes
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "deployment_indexes"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_deployments_model_name_status", "deployments", ["model_name", "status"])
    op.create_index("ix_deployments_requested_at", "deployments", ["requested_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_deployments_requested_at", table_name="deployments")
    op.drop_index("ix_deployments_model_name_status", table_name="deployments")
