"""The last memory sample of each deployment's engine, and since when it is over its budget.

Revision ID: meter
Revises: queue
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "meter"
down_revision = "queue"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("memory_used_bytes", sa.BigInteger))
        batch.add_column(sa.Column("memory_sampled_at", sa.DateTime(timezone=True)))
        batch.add_column(sa.Column("over_budget_since", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("over_budget_since")
        batch.drop_column("memory_sampled_at")
        batch.drop_column("memory_used_bytes")
