"""Named API tokens (stored as SHA-256 digests), and when each node was first seen.

Revision ID: api_tokens
Revises: engine_settings
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "api_tokens"
down_revision = "engine_settings"
branch_labels = None
depends_on = None

ID = sa.String(36)
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.Column("scope", sa.String(255)),
        sa.Column("audience", sa.String(255)),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("expires_at", WHEN),
        sa.Column("revoked_at", WHEN),
    )
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("created_at", WHEN))
    # Nodes stored before this revision: first seen no later than their last update.
    op.execute("UPDATE nodes SET created_at = updated_at")


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("created_at")
    op.drop_table("api_tokens")
