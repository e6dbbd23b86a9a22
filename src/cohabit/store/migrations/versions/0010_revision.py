"""Each deployment's revision: a count of the writes to its row (the lease's aside).

Revision ID: revision
Revises: meter
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "revision"
down_revision = "meter"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("revision", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("revision")
