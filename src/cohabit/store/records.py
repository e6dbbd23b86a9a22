"""The values repository functions return (frozen, slotted, keyword-only), and the deployment
statuses. Rows never leave `store/`; these do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from cohabit.placement.planner import PlacementFields


class DeploymentStatus(StrEnum):
    """DESIGN.md §3. A deployment holds a reservation exactly while it is DEPLOYING (once
    placed), INITIALIZING or DEPLOYED."""

    REQUESTED = "REQUESTED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    DEPLOYED = "DEPLOYED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    FAILED = "FAILED"
    MUST_REDOWNLOAD = "MUST_REDOWNLOAD"


ACTIVE = frozenset(
    {
        DeploymentStatus.REQUESTED,
        DeploymentStatus.DEPLOYING,
        DeploymentStatus.INITIALIZING,
        DeploymentStatus.DEPLOYED,
    }
)
HOLDING = frozenset(
    {DeploymentStatus.DEPLOYING, DeploymentStatus.INITIALIZING, DeploymentStatus.DEPLOYED}
)
NO_FIT_ERROR = "NoFitError"
# The length of the name and repo-id columns (tables.py); the API's schemas refuse longer
# values so that SQLite (which ignores lengths) and PostgreSQL (which enforces them) agree.
NAME_CHARS = 255


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFileRecord:
    id: str
    model_id: str
    name: str
    size_bytes: int | None
    storage_type: str
    storage_location: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRecord:
    id: str
    name: str
    repo_id: str | None
    hub: str | None
    source: str
    model_path: str | None
    format: str
    description: str | None
    created_at: datetime
    modified_at: datetime
    files: tuple[ModelFileRecord, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfigRecord:
    id: str
    model_id: str
    file_id: str | None
    name: str | None
    default: bool
    description: str | None
    config: Mapping[str, Any]
    system_config: Mapping[str, Any]
    created_at: datetime
    modified_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewDeployment:
    """What admission decided: the model, its engine, the bytes per shard to reserve."""

    id: str
    model_id: str
    config_id: str
    file_id: str | None
    model_name: str
    engine: str
    request: Mapping[str, Any]
    model_path: str | None
    requested_bytes: int
    tensor_parallel: int
    max_model_len: int | None
    estimate: Mapping[str, Any] | None
    engine_settings: Mapping[str, Any] = field(default_factory=dict)  # EngineSettings.to_dict()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentRecord:
    id: str
    model_id: str
    config_id: str
    file_id: str | None
    model_name: str
    engine: str
    status: DeploymentStatus
    request: Mapping[str, Any]
    model_path: str | None
    requested_bytes: int
    tensor_parallel: int
    max_model_len: int | None
    estimate: Mapping[str, Any] | None
    engine_settings: Mapping[str, Any]  # EngineSettings.to_dict(); {} for older rows
    placement: PlacementFields | None  # Placement.record_fields, as stored
    no_fit: Mapping[str, Any] | None
    last_error_code: str | None
    last_error_message: str | None
    last_error_at: datetime | None
    engine_handle: Mapping[str, Any] | None
    claimed_by: str | None
    claimed_until: datetime | None
    requested_at: datetime
    deployed_at: datetime | None
    stopped_at: datetime | None
    released_at: datetime | None
    # The meter's last sample (None until one is taken) and since when it is over budget.
    memory_used_bytes: int | None = None
    memory_sampled_at: datetime | None = None
    over_budget_since: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationRecord:
    deployment_id: str
    node_name: str
    gpu_index: int | None
    partition_index: int | None
    reserved_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentFailure:
    """An error to record on a deployment: the status it ends in, the code and the message."""

    status: DeploymentStatus
    code: str
    message: str
    no_fit: Mapping[str, Any] | None = field(default=None)
    at: datetime | None = None  # when it was seen (the runtime's clock); None: now
