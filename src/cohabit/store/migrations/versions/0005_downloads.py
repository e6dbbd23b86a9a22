"""Downloads from the Hugging Face Hub: one row per file asked for, its progress and outcome.

Revision ID: downloads
Revises: deployment_indexes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "downloads"
down_revision = "deployment_indexes"
branch_labels = None
depends_on = None

ID = sa.String(36)
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "downloads",
        sa.Column("id", ID, primary_key=True),
        sa.Column("model_id", ID, sa.ForeignKey("models.id", ondelete="CASCADE"), index=True),
        sa.Column("file_id", ID, nullable=False, index=True),
        sa.Column("repo_id", sa.String(255), nullable=False),
        sa.Column("revision", sa.String(255), nullable=False),
        sa.Column("filename", sa.String(512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("sha256", sa.String(64)),
        sa.Column("blob_id", sa.String(40)),
        sa.Column("to_cache", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("done_bytes", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("path", sa.Text),
        sa.Column("requested_at", WHEN, nullable=False),
        sa.Column("started_at", WHEN),
        sa.Column("heartbeat_at", WHEN),
        sa.Column("finished_at", WHEN),
    )


def downgrade() -> None:
    op.drop_table("downloads")
