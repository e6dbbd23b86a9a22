"""Deployments keep the engine settings admission parsed (EngineSettings.to_dict()), so the
engine is launched with the configuration its budget was sized for.

Revision ID: engine_settings
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "engine_settings"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("engine_settings", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("engine_settings")
