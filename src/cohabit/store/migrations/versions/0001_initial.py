"""The first schema: models, model files, model configs, deployments, reservations, nodes.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(36)
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("repo_id", sa.String(255), index=True),
        sa.Column("hub", sa.String(64)),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("model_path", sa.Text),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("modified_at", WHEN, nullable=False),
    )
    op.create_table(
        "model_files",
        sa.Column("id", ID, primary_key=True),
        sa.Column("model_id", ID, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("storage_type", sa.String(32), nullable=False),
        sa.Column("storage_location", sa.Text),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "model_configs",
        sa.Column("id", ID, primary_key=True),
        sa.Column("model_id", ID, sa.ForeignKey("models.id", ondelete="CASCADE"), nullable=False),
        sa.Column("file_id", ID),
        sa.Column("name", sa.String(255)),
        sa.Column("is_default", sa.Boolean, nullable=False),
        sa.Column("description", sa.Text),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("system_config", sa.JSON, nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("modified_at", WHEN),
    )
    op.create_table(
        "deployments",
        sa.Column("id", ID, primary_key=True),
        sa.Column("model_id", ID, sa.ForeignKey("models.id"), nullable=False, index=True),
        sa.Column("config_id", ID, nullable=False),
        sa.Column("file_id", ID),
        sa.Column("model_name", sa.String(255), nullable=False),
        sa.Column("engine", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False, index=True),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("model_path", sa.Text),
        sa.Column("requested_bytes", sa.BigInteger, nullable=False),
        sa.Column("tensor_parallel", sa.Integer, nullable=False),
        sa.Column("max_model_len", sa.Integer),
        sa.Column("estimate", sa.JSON),
        sa.Column("topology", sa.String(32)),
        sa.Column("node_name", sa.String(255)),
        sa.Column("gpu_index", sa.Integer),
        sa.Column("gpu_indices", sa.JSON),
        sa.Column("partition", sa.String(64)),
        sa.Column("gpu_vendor", sa.String(32)),
        sa.Column("gpu_id", sa.String(255)),
        sa.Column("hardware_class", sa.String(32)),
        sa.Column("sharing_class", sa.String(64)),
        sa.Column("allocated_bytes", sa.BigInteger),
        sa.Column("device_total_bytes", sa.BigInteger),
        sa.Column("notices", sa.JSON),
        sa.Column("no_fit", sa.JSON),
        sa.Column("last_error_code", sa.String(64)),
        sa.Column("last_error_message", sa.Text),
        sa.Column("last_error_at", WHEN),
        sa.Column("engine_handle", sa.JSON),
        sa.Column("claimed_by", sa.String(64)),
        sa.Column("claimed_until", WHEN),
        sa.Column("requested_at", WHEN, nullable=False),
        sa.Column("deployed_at", WHEN),
        sa.Column("stopped_at", WHEN),
        sa.Column("released_at", WHEN),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("deployment_id", ID, sa.ForeignKey("deployments.id"), nullable=False, index=True),
        sa.Column("node_name", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer),
        sa.Column("partition_index", sa.Integer),
        sa.Column("reserved_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("topology", sa.String(32), nullable=False),
        sa.Column("fractional", sa.Boolean, nullable=False),
        sa.Column("sharing_configured", sa.Boolean, nullable=False),
        sa.Column("updated_at", WHEN, nullable=False),
    )


def downgrade() -> None:
    for table in ("nodes", "reservations", "deployments", "model_configs", "model_files"):
        op.drop_table(table)
    op.drop_table("models")
