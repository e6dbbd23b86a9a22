"""Residency: what a sleeping copy's reservation still holds, and what it takes back.

A sleeping engine keeps only a residue on its devices: a reservation's `reserved_bytes`
shrinks to it, and `budget_bytes` keeps the full budget a wake must take back (NULL while
awake). At sleep level 1 the weights wait in the node's host memory: `host_bytes`. The
deployment's `sleep_level` is 1 or 2 from the moment it is put to sleep until it serves
again (NULL while awake): it does not serve meanwhile.

Revision ID: residency
Revises: inventory
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "residency"
down_revision = "inventory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reservations") as batch:
        batch.add_column(sa.Column("budget_bytes", sa.BigInteger))
        batch.add_column(sa.Column("host_bytes", sa.BigInteger))
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("sleep_level", sa.SmallInteger))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("sleep_level")
    with op.batch_alter_table("reservations") as batch:
        batch.drop_column("host_bytes")
        batch.drop_column("budget_bytes")
