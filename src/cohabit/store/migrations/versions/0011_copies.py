"""Copies: a deployment may run several engines. Copy 0 is the deployment's own row; copies
1..n-1 are rows of their own that point at it (`copy_of`) with their index (`copy_index`).

Revision ID: copies
Revises: revision
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "copies"
down_revision = "revision"
branch_labels = None
depends_on = None

COPY_PREDICATE = "copy_of IS NOT NULL"  # as store/tables.py has it, at this revision


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("copy_of", sa.String(36)))
        batch.add_column(sa.Column("copy_index", sa.Integer, nullable=False, server_default="0"))
        batch.create_foreign_key("fk_deployments_copy_of", "deployments", ["copy_of"], ["id"])
        # Partial (store/tables.py says why): copy 0's rows, every deployment, stay out.
        batch.create_index(
            "ix_deployments_copy_of",
            ["copy_of"],
            sqlite_where=sa.text(COPY_PREDICATE),
            postgresql_where=sa.text(COPY_PREDICATE),
        )


def downgrade() -> None:
    # The copies' rows go (their reservations and events with them): the old code knows
    # one engine per deployment.
    copies = "SELECT id FROM deployments WHERE copy_of IS NOT NULL"
    op.execute(f"DELETE FROM reservations WHERE deployment_id IN ({copies})")
    op.execute(f"DELETE FROM events WHERE deployment_id IN ({copies})")
    op.execute("DELETE FROM deployments WHERE copy_of IS NOT NULL")
    with op.batch_alter_table("deployments") as batch:
        batch.drop_index("ix_deployments_copy_of")
        batch.drop_constraint("fk_deployments_copy_of", type_="foreignkey")
        batch.drop_column("copy_index")
        batch.drop_column("copy_of")
