"""The values repository functions return (frozen, slotted, keyword-only), and the deployment
statuses. Rows never leave `store/`; these do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from enum import StrEnum
from typing import Any

from cohabit.placement.decision import PlacementFields


class DeploymentStatus(StrEnum):
    """docs/api.md. A deployment holds a reservation exactly while it is DEPLOYING (once
    placed), INITIALIZING or DEPLOYED. UNLOADED: scaled to zero (no engine, no budget), still
    listed and routable; a request loads it again (back to REQUESTED). QUEUED: asked to wait
    for room (`queue`) and did not fit, even by unloading idle copies; placed, in priority then
    arrival order, when room appears."""

    REQUESTED = "REQUESTED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    DEPLOYED = "DEPLOYED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    FAILED = "FAILED"
    MUST_REDOWNLOAD = "MUST_REDOWNLOAD"
    UNLOADED = "UNLOADED"
    QUEUED = "QUEUED"


# Not ended: listed first, routable, never purged; a stop ends it.
ACTIVE = frozenset(
    {
        DeploymentStatus.REQUESTED,
        DeploymentStatus.DEPLOYING,
        DeploymentStatus.INITIALIZING,
        DeploymentStatus.DEPLOYED,
        DeploymentStatus.UNLOADED,
        DeploymentStatus.QUEUED,
    }
)
# Driven by a reconciler (claimed under a lease, an engine on its way or running): the
# active ones but UNLOADED, which nobody drives until it is loaded again, and QUEUED, which
# a reconciler takes when it fits.
DRIVEN = ACTIVE - {DeploymentStatus.UNLOADED, DeploymentStatus.QUEUED}
# Ended for good: never changes again, never driven, purged after the retention.
ENDED = frozenset(DeploymentStatus) - ACTIVE
HOLDING = frozenset(
    {DeploymentStatus.DEPLOYING, DeploymentStatus.INITIALIZING, DeploymentStatus.DEPLOYED}
)
NO_FIT_ERROR = "NoFitError"
KEEP_ALIVE_S = 300  # how long a scale-to-zero deployment stays loaded while idle
NEVER = -1  # keep_alive: never unload
# What admission accepts (the API's schemas refuse the rest with a 422; the columns are
# 32-bit integers on PostgreSQL, so every bound keeps well inside them).
PRIORITY_RANGE = (-1000, 1000)
MAX_KEEP_ALIVE_S = 366 * 24 * 3600  # a year
MAX_COPIES = 1000
MAX_DURATION_MIN = 10 * 366 * 24 * 60  # ten years
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
class NewConfig:
    """A model config to store: engine settings a deploy starts from (`config`), and those
    the system sets (`system_config`)."""

    model_id: str
    file_id: str | None
    name: str | None
    default: bool
    description: str | None
    config: Mapping[str, Any]
    system_config: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfigRecord(NewConfig):
    """A model config as stored."""

    id: str
    created_at: datetime
    modified_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Scaling:
    """How a deployment may scale and how long it lives, as admission parsed it.

    `min_copies` 0: it may be unloaded after `keep_alive_s` idle seconds (`NEVER`: it is
    not) and is loaded again on demand. `starting_copies` engines (copies) start at deploy;
    autoscaling keeps between `min_copies` (one at least while loaded) and `max_copies`
    (docs/copies.md). `priority` and `queue` are
    for placement (higher priority may unload idle lower ones; `queue` waits for room
    instead of failing). `duration_min`: it is stopped at `ends_at`, that many minutes
    after it was requested (None: it runs until stopped).
    """

    priority: int = 0
    keep_alive_s: int = KEEP_ALIVE_S
    queue: bool = False
    min_copies: int = 1
    starting_copies: int = 1
    max_copies: int | None = None
    duration_min: int | None = None
    ends_at: datetime | None = None  # set by the store from the request time

    @property
    def scales_to_zero(self) -> bool:
        return self.min_copies == 0 and self.keep_alive_s != NEVER


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
    scaling: Scaling = field(default_factory=Scaling)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentRecord(NewDeployment):
    """A deployment as stored: what admission decided (`engine_settings` is {} for rows
    older than it), and where the deployment is in its life."""

    status: DeploymentStatus
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
    last_used_at: datetime | None = None  # the last request seen by any server (flushed)
    # The meter's last sample (None until one is taken) and since when it is over budget.
    memory_used_bytes: int | None = None
    memory_sampled_at: datetime | None = None
    over_budget_since: datetime | None = None
    sleep_level: int | None = None  # the warm tier: 1 or 2 while it does not serve
    # A copy of another deployment (its id, copy 0's) with its index; None and 0: the
    # deployment itself (copy 0).
    copy_of: str | None = None
    copy_index: int = 0

    @property
    def deployment_id(self) -> str:
        """The id of the deployment this row is a copy of (its own id for copy 0)."""
        return self.copy_of or self.id

    def decided(self) -> NewDeployment:
        """What admission decided for this deployment (a new copy of it is asked for so)."""
        return NewDeployment(**{f.name: getattr(self, f.name) for f in fields(NewDeployment)})


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
