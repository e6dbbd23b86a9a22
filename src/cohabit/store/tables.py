"""The tables (SQLAlchemy 2 declarative). Only `store/` sees these classes; repository functions
map rows to the frozen records in `records.py`. The schema itself is created by the Alembic
migrations in `migrations/versions/`, which must be kept in step with this file."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    false,
    literal_column,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from cohabit.store.records import NAME_CHARS

ID = String(36)  # UUIDs as text: the same on SQLite and PostgreSQL, and what the API speaks
# The active statuses (records.ACTIVE) as the queries in deployments.py write them.
ACTIVE_PREDICATE = (
    "status IN ('DEPLOYED', 'DEPLOYING', 'INITIALIZING', 'QUEUED', 'REQUESTED', 'UNLOADED')"  # 0009
)
COPY_PREDICATE = "copy_of IS NOT NULL"  # the rows of copies beyond copy 0 (0011)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
    }


class ModelRow(Base):
    __tablename__ = "models"
    # One model per name: `name_key` is the normalised name's digest (catalog.name_key),
    # unique since migration 0012.
    __table_args__ = (Index("ux_models_name_key", "name_key", unique=True),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_CHARS))
    # The default is the migration's (SQLite adds a NOT NULL column in place only with
    # one); every insert sets the key.
    name_key: Mapped[str] = mapped_column(String(64), server_default="")
    repo_id: Mapped[str | None] = mapped_column(String(NAME_CHARS), index=True)
    hub: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)  # what the user registered: a path or a repo id
    model_path: Mapped[str | None] = mapped_column(Text)  # what an engine loads; None: not local
    format: Mapped[str] = mapped_column(String(32))  # gguf | safetensors
    description: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    modified_at: Mapped[datetime]


class ModelFileRow(Base):
    __tablename__ = "model_files"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    model_id: Mapped[str] = mapped_column(ID, ForeignKey("models.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    storage_type: Mapped[str] = mapped_column(String(32))
    storage_location: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class ModelConfigRow(Base):
    __tablename__ = "model_configs"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    model_id: Mapped[str] = mapped_column(ID, ForeignKey("models.id", ondelete="CASCADE"))
    file_id: Mapped[str | None] = mapped_column(ID)
    name: Mapped[str | None] = mapped_column(String(NAME_CHARS))
    is_default: Mapped[bool] = mapped_column(Boolean)
    description: Mapped[str | None] = mapped_column(Text)
    config: Mapped[dict[str, Any]]
    system_config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    modified_at: Mapped[datetime | None]


OWNER_CHARS = 64  # a lease owner's id (store.deployments.owner_id keeps within it)


class DeploymentRow(Base):
    """One deployment: what was asked, where it landed, how its engine is doing.

    `claimed_by`/`claimed_until` is the lease of the reconciler (one per server process) that
    drives it; another process takes over only once the lease has run out.
    """

    __tablename__ = "deployments"
    # Routing by served name, the newest-first pages of ended ones, and the active ones
    # (a partial index) — migration 0002.
    __table_args__ = (
        Index("ix_deployments_model_name_status", "model_name", "status"),
        Index("ix_deployments_requested_at", "requested_at", "id"),
        Index(
            "ix_deployments_active",
            "requested_at",
            "id",
            sqlite_where=text(ACTIVE_PREDICATE),
            postgresql_where=text(ACTIVE_PREDICATE),
        ),
        # The copies of a deployment (migration 0011). Partial: an index of every row would
        # let a planner take `copy_of IS NULL` (every deployment's own row) through it and
        # sort a page's matches instead of walking the order's index to the page's end.
        Index(
            "ix_deployments_copy_of",
            "copy_of",
            sqlite_where=text(COPY_PREDICATE),
            postgresql_where=text(COPY_PREDICATE),
        ),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    model_id: Mapped[str] = mapped_column(ID, ForeignKey("models.id"), index=True)
    config_id: Mapped[str] = mapped_column(ID)
    file_id: Mapped[str | None] = mapped_column(ID)
    model_name: Mapped[str] = mapped_column(String(NAME_CHARS))
    engine: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32), index=True)
    request: Mapped[dict[str, Any]]
    model_path: Mapped[str | None] = mapped_column(Text)
    requested_bytes: Mapped[int] = mapped_column(BigInteger)
    tensor_parallel: Mapped[int] = mapped_column(Integer)
    max_model_len: Mapped[int | None] = mapped_column(Integer)
    estimate: Mapped[dict[str, Any] | None]
    engine_settings: Mapped[dict[str, Any] | None]  # EngineSettings.to_dict() at admission
    topology: Mapped[str | None] = mapped_column(String(32))
    node_name: Mapped[str | None] = mapped_column(String(255))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    gpu_indices: Mapped[dict[str, Any] | None]  # {"indices": [...]}: JSON needs an object
    partition: Mapped[str | None] = mapped_column(String(64))
    gpu_vendor: Mapped[str | None] = mapped_column(String(32))
    gpu_id: Mapped[str | None] = mapped_column(String(255))
    hardware_class: Mapped[str | None] = mapped_column(String(32))
    sharing_class: Mapped[str | None] = mapped_column(String(64))
    allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    device_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    notices: Mapped[dict[str, Any] | None]
    no_fit: Mapped[dict[str, Any] | None]
    last_error_code: Mapped[str | None] = mapped_column(String(64))
    last_error_message: Mapped[str | None] = mapped_column(Text)
    last_error_at: Mapped[datetime | None]
    engine_handle: Mapped[dict[str, Any] | None]
    claimed_by: Mapped[str | None] = mapped_column(String(OWNER_CHARS))
    claimed_until: Mapped[datetime | None]
    requested_at: Mapped[datetime]
    deployed_at: Mapped[datetime | None]
    stopped_at: Mapped[datetime | None]
    released_at: Mapped[datetime | None]
    # Scaling (records.Scaling) — migration 0007.
    priority: Mapped[int] = mapped_column(Integer, server_default="0")
    keep_alive_s: Mapped[int] = mapped_column(Integer, server_default="300")
    queue: Mapped[bool] = mapped_column(Boolean, server_default=false())
    min_copies: Mapped[int] = mapped_column(Integer, server_default="1")
    starting_copies: Mapped[int] = mapped_column(Integer, server_default="1")
    max_copies: Mapped[int | None] = mapped_column(Integer)
    duration_min: Mapped[int | None] = mapped_column(Integer)
    ends_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]  # flushed from the servers' traffic counters
    # The meter's last sample of the engine's memory, and since when it is over budget.
    memory_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_sampled_at: Mapped[datetime | None]
    over_budget_since: Mapped[datetime | None]
    # The warm tier — migration 0014: 1 or 2 while the engine is put to sleep, sleeps, or
    # wakes (store/residency.py); it does not serve meanwhile. NULL while it is awake.
    sleep_level: Mapped[int | None] = mapped_column(SmallInteger)
    # Copies — migration 0011: NULL and 0 on a deployment's own row (copy 0); the others
    # point at it, numbered from 1.
    copy_of: Mapped[str | None] = mapped_column(
        ID, ForeignKey("deployments.id", name="fk_deployments_copy_of")
    )
    copy_index: Mapped[int] = mapped_column(Integer, server_default="0")
    # Bumped by every UPDATE of the row that does not set it itself (SQLAlchemy adds
    # `revision = revision + 1`); only the lease writes keep it. What a rendering of the
    # record kept by a server is checked against — migration 0010.
    revision: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0", onupdate=literal_column("revision") + 1
    )


class ReservationRow(Base):
    """Bytes one deployment holds on one slot. A row exists exactly while the budget is held.

    While its engine sleeps (store/residency.py), `reserved_bytes` is the residue it still
    holds there, `budget_bytes` the full budget a wake takes back and `host_bytes` the weights
    level 1 keeps in the node's host memory; both NULL while it is awake (migration
    0014_residency)."""

    __tablename__ = "reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ID, ForeignKey("deployments.id"), index=True)
    node_name: Mapped[str] = mapped_column(String(255))
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    partition_index: Mapped[int | None] = mapped_column(Integer)
    reserved_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    budget_bytes: Mapped[int | None] = mapped_column(BigInteger)
    host_bytes: Mapped[int | None] = mapped_column(BigInteger)


class NodeRow(Base):
    """One node of the fleet placement sees, as JSON; `position` keeps the fleet's order (it
    breaks placement ties). The fleet-wide settings ride on every row of one fleet."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]]
    topology: Mapped[str] = mapped_column(String(32))
    fractional: Mapped[bool] = mapped_column(Boolean)
    sharing_configured: Mapped[bool] = mapped_column(Boolean)
    updated_at: Mapped[datetime]
    created_at: Mapped[datetime | None]  # first seen; the cluster views show it


class ApiTokenRow(Base):
    """A named API token. Only the SHA-256 of the token is kept: the plaintext is shown once,
    when it is made. `revoked_at` set: refused from then on (the row stays, for the list)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_by: Mapped[str] = mapped_column(String(255))
    scope: Mapped[str | None] = mapped_column(String(255))
    audience: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]


class DownloadRow(Base):
    """One file asked for from the Hub. `status`: queued → running → done | failed; a row
    left `running` by a server that stopped (no heartbeat for a while) is queued again."""

    __tablename__ = "downloads"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    model_id: Mapped[str] = mapped_column(
        ID, ForeignKey("models.id", ondelete="CASCADE"), index=True
    )
    file_id: Mapped[str] = mapped_column(ID, index=True)
    repo_id: Mapped[str] = mapped_column(String(255))
    revision: Mapped[str] = mapped_column(String(255))  # the commit it was asked at
    filename: Mapped[str] = mapped_column(String(512))
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    sha256: Mapped[str | None] = mapped_column(String(64))  # LFS files
    blob_id: Mapped[str | None] = mapped_column(String(40))  # git blob sha1
    to_cache: Mapped[bool] = mapped_column(Boolean)  # the shared Hugging Face cache
    status: Mapped[str] = mapped_column(String(16), index=True)
    done_bytes: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str | None] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(Text)
    requested_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]  # last progress: a stale running row is requeued
    finished_at: Mapped[datetime | None]


class EventRow(Base):
    """One step of a deployment's timeline (store/events.py). `id` orders the events and is
    the cursor a follower resumes from; the rows go with their deployment's record."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_deployment_id", "deployment_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ID, ForeignKey("deployments.id", ondelete="CASCADE"))
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None]


class InventoryRow(Base):
    """A location, cluster or hardware entry an admin registered (store/inventory.py)."""

    __tablename__ = "inventory"
    __table_args__ = (Index("ix_inventory_kind", "kind", "created_at"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(NAME_CHARS))
    fields: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
