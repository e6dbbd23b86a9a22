"""Typed bodies the SDK sends and reads, shared by `Client` and `AsyncClient`.

They mirror the server's API schemas (docs/api.md) but are the client's own: the SDK must not
import the server, and a client has to read what newer servers send, so every response model
keeps unknown fields (`extra="allow"`). Unlike the kamiwaza SDK's, `Deployment` declares every
placement field (`topology`, `node_name`, `gpu_index`, `hardware_class`, …) and `last_error_at`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from cohabit.sdk.statuses import ACTIVE_STATUSES
from cohabit.sdk.statuses import FAILURE_STATUSES as FAILURE_STATUSES  # once defined here
from cohabit.sdk.statuses import READY_STATUSES as READY_STATUSES


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class CreateModelDeployment(BaseModel):
    """The body of deploy_model and estimate_model_vram. Fields beyond these (kwargs of
    `deploy_model`) are sent as given."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    m_id: UUID
    m_config_id: UUID | None = None
    m_file_id: UUID | None = None
    engine_name: str | None = None
    vram_allocation: float | None = Field(default=None, description="Bytes per device.")
    force_cpu: bool = False
    over_budget: str = "warn"
    duration: int | None = Field(default=None, description="Minutes until it is stopped.")
    min_copies: int = Field(default=1, description="0: unloaded when idle, loaded on demand.")
    starting_copies: int = 1
    max_copies: int | None = None
    keep_alive: int | None = Field(default=None, description="Idle seconds; -1: never unload.")
    priority: int | None = None
    queue: bool | None = None
    location: str | None = None
    lb_port: int = 0
    autoscaling: bool = False

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ModelInstance(_Response):
    id: UUID
    deployment_id: UUID
    deployed_at: datetime | None = None
    container_id: str | None = None
    node_id: UUID | None = None
    host_name: str | None = None
    listen_port: int | None = None
    status: str = "UNINITIALIZED"
    extra_details: dict[str, Any] = Field(default_factory=dict)

    @property
    def copy_index(self) -> int:
        """Which copy of its deployment it is (0: the deployment's own engine)."""
        return int(self.extra_details.get("copy_index", 0))

    @property
    def base_url(self) -> str | None:
        """Its engine's root URL (the gateway's route balances over every copy's)."""
        value = self.extra_details.get("base_url")
        return None if value is None else str(value)


class LoadProgress(_Response):
    """A load under way: its current phase (`placing`, `starting`, `engine_load`,
    `weights_load`, `engine_warmup`) since `since`, lasting `elapsed_s` at `as_of`, and the
    phases of this load already finished (name → seconds)."""

    phase: str
    elapsed_s: float
    since: datetime
    began_at: datetime
    as_of: datetime
    phases_s: dict[str, float] = Field(default_factory=dict)


class NoFitDetails(_Response):
    """Why placement refused it: the reason id, the sentence, and the numbers."""

    reason: str
    message: str
    requested_bytes: int | None = None
    largest_free_bytes: int | None = None
    largest_free_location: str | None = None
    nodes_considered: int | None = None
    node_reasons: dict[str, int] = Field(default_factory=dict)
    candidates_considered: int | None = None
    candidates_filtered: dict[str, int] | int | None = None
    hint: str | None = None


class Deployment(_Response):
    """One deployment (`UIModelDeployment` plus placement)."""

    id: UUID
    m_id: UUID
    m_config_id: UUID | None = None
    m_file_id: UUID | None = None
    m_name: str | None = None
    engine_name: str | None = None
    status: str = "UNINITIALIZED"
    requested_at: datetime | None = None
    deployed_at: datetime | None = None
    stopped_at: datetime | None = None
    last_error_code: str | None = None
    last_error_message: str | None = None
    last_error_at: datetime | None = None
    instances: list[ModelInstance] = Field(default_factory=list)  # one per started copy
    # Copies now (not ended, copy 0 included) and those serving; None from a server that
    # does not say (one from before copies).
    copies: int | None = None
    ready_copies: int | None = None
    lb_port: int = 0
    serve_path: str | None = None
    access_path: str | None = None
    endpoint: str | None = None
    # placement: where it landed and what it holds
    topology: str | None = None
    sub_mode: str | None = None
    node_name: str | None = None
    gpu_index: int | None = None
    gpu_indices: list[int] = Field(default_factory=list)
    partition: str | None = None
    gpu_vendor: str | None = None
    gpu_id: str | None = None
    hardware_class: str | None = None
    sharing_class: str | None = None
    allocated_capacity_gb: int | None = None
    allocated_bytes: int | None = None
    requested_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int | None = None
    spawner_process: dict[str, Any] | None = None
    health_details: dict[str, Any] | None = None
    notices: list[str] = Field(default_factory=list)
    no_fit: NoFitDetails | None = None
    estimate: dict[str, Any] | None = None
    memory_used_bytes: int | None = None  # the engine's memory at the meter's last sample
    memory_sampled_at: datetime | None = None
    loading: LoadProgress | None = None  # while it loads: the phase under way
    # what was asked for, as the deploy body gave it
    vram_allocation: float | None = None
    gpu_allocation: float | None = None
    force_cpu: bool = False
    over_budget: str = "warn"  # what happens when its engine passes its budget
    duration: int | None = None
    min_copies: int = 1
    starting_copies: int = 1
    max_copies: int | None = None
    keep_alive: int = 300
    priority: int = 0
    queue: bool = False
    ends_at: datetime | None = None
    last_used_at: datetime | None = None
    location: str | None = None
    autoscaling: bool = False
    node_resource_type: str | None = None
    max_concurrent_requests: int | None = None
    single_node_mode: bool = False
    inference_resources: dict[str, Any] | None = Field(default=None, alias="inferenceResources")

    @property
    def is_active(self) -> bool:
        """Not ended: placed, on its way, or UNLOADED (routable, loaded on demand)."""
        return self.status.upper() in ACTIVE_STATUSES


class ActiveDeployment(Deployment):
    """A DEPLOYED deployment with a serving instance, and the URL that reaches it."""

    endpoint: str

    @property
    def is_available(self) -> bool:
        return any(instance.status == "DEPLOYED" for instance in self.instances)


class VramEstimate(_Response):
    """What a deployment would reserve per device (bytes) against the largest device."""

    computed_vram_estimate: float
    highest_node_vram: float
    estimation_source: str
    requested_bytes: int | None = None
    requested_capacity_gb: int | None = None
    engine_name: str | None = None
    tensor_parallel_size: int | None = None
    estimate: dict[str, Any] | None = None

    @property
    def vram_exceeds_total(self) -> bool:
        """The anchor's own gate: bigger than the largest device (0 means unknown)."""
        return self.computed_vram_estimate > self.highest_node_vram > 0


class ContainerLogResponse(_Response):
    deployment_id: UUID
    engine_type: str | None = None
    container_id: str | None = None
    log_file_path: str | None = None
    logs: list[str] = Field(default_factory=list)
    total_lines_seen: int = 0
    current_lines_stored: int = 0
    compressed: bool = False
    capture_active: bool = False


class ContainerLogPatternResponse(_Response):
    """Failure patterns found in the log tail; informational, never changes a status."""

    deployment_id: UUID
    patterns_detected: dict[str, bool] = Field(default_factory=dict)
    analysis_timestamp: datetime | None = None
    failure_lines: list[dict[str, str]] = Field(default_factory=list)


class DeploymentEvent(_Response):
    """One step of a deployment's timeline: `kind` is requested, placed, reserved, started,
    healthy, no_fit, failed, stopped (and others newer servers add); `data` its numbers."""

    id: int
    at: datetime
    kind: str
    message: str
    data: dict[str, Any] | None = None


class DeploymentEvents(_Response):
    """A page of a deployment's timeline, oldest first; pass `cursor` as the next `after`."""

    deployment_id: UUID
    status: str
    ended: bool
    events: list[DeploymentEvent] = Field(default_factory=list)
    cursor: int = 0


class ModelFile(_Response):
    id: UUID
    name: str
    size: int | None = None
    storage_type: str | None = None
    storage_host: str | None = None
    storage_location: str | None = None
    hub: str | None = None
    model_id: UUID | None = None
    created_timestamp: datetime | None = None


class Model(_Response):
    id: UUID
    name: str
    repo_modelId: str | None = None  # noqa: N815 - the wire name
    format: str | None = None
    model_path: str | None = None
    source_repository: str | None = None
    hub: str | None = None
    description: str | None = None
    m_files: list[ModelFile] = Field(default_factory=list)
    default_config: dict[str, Any] | None = None
    created_timestamp: datetime | None = None
    modified_timestamp: datetime | None = None
    modelfamily: str | None = None
    purpose: str | None = None
    version: str | None = None
    author: str | None = None
    private: bool = False
    hosted: str | None = None
    files_being_downloaded: list[ModelFile] = Field(default_factory=list)


class CreateModel(BaseModel):
    """Register a model from a local `path` (a .gguf file or a checkpoint directory) or a
    Hugging Face `repo_modelId`."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    path: str | None = None
    repo_modelId: str | None = None  # noqa: N815 - the wire name
    description: str | None = None


class CreateModelConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    m_id: UUID
    m_file_id: UUID | None = None
    name: str | None = None
    default: bool = False
    description: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    system_config: dict[str, Any] = Field(default_factory=dict)


class ModelConfig(_Response):
    id: UUID
    m_id: UUID
    m_file_id: UUID | None = None
    name: str | None = None
    default: bool = False
    description: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    system_config: dict[str, Any] = Field(default_factory=dict)
    kamiwaza_version: str | None = None
    created_at: datetime | None = None
    modified_at: datetime | None = None


class HardwareSlot(_Response):
    """One budget holder as the server sees it: a GPU, a partition or a memory pool, with
    what is reserved on it."""

    location: str
    gpu_index: int | None = None
    partition: str | None = None
    vendor: str
    product: str
    hardware_class: str
    sharing_class: str
    total_bytes: int
    capacity_bytes: int
    reserved_bytes: int
    free_bytes: int
    capacity_gb: int
    free_gb: int


class HardwareNode(_Response):
    """One node of `GET /cluster/hardware`: `id` and `node_id` are stable UUIDs, `name` the
    node's name; or a hardware entry an admin registered (`registered`: no node, no slots,
    never placed on)."""

    id: UUID
    name: str | None
    node_name: str | None
    node_id: UUID | None
    created_at: datetime
    active: bool = True
    registered: bool = False
    os: str | None = None
    platform: str | None = None
    topology: str | None = None
    gpus: list[dict[str, Any]] = Field(default_factory=list)
    processors: list[str] = Field(default_factory=list)
    processor_vendor: str | None = None
    cluster_ip: str | None = None
    local_node_id: str | None = None
    ray_node_id: str | None = None
    configuration: dict[str, Any] = Field(default_factory=dict)
    memory_bytes: int | None = None
    unified_memory_bytes: int | None = None
    schedulable: bool = True
    unschedulable_reason: str | None = None
    notices: list[dict[str, str]] = Field(default_factory=list)
    slots: list[HardwareSlot] = Field(default_factory=list)


class UserInfo(_Response):
    """`GET /auth/users/me`: the name and role of the token this client sends."""

    username: str
    email: str | None = None
    groups: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    sub: str


class ApiToken(_Response):
    """A named API token as the server lists it (never its secret)."""

    id: UUID
    jti: str
    name: str
    role: str
    owner_id: str
    scope: str | None = None
    aud: str | None = None
    ttl_seconds: int | None = None
    exp: int | None = None
    expires_at: datetime | None = None
    tenant_id: str | None = None
    created_at: datetime
    updated_at: datetime
    revoked: bool = False


class CreatedToken(_Response):
    """A new token: `token` is its secret, shown this once."""

    token: str
    pat: ApiToken


class DownloadStarted(_Response):
    """What `POST /models/download/` queued: the model the files belong to, the variant
    chosen (and why), the files now downloading and those already here."""

    result: bool
    message: str
    model_id: UUID
    variant: str | None = None
    reason: str | None = None
    files: list[str] = Field(default_factory=list)
    already_downloaded: list[str] = Field(default_factory=list)


class DownloadStatus(_Response):
    """One file's download (`GET /model_files/download_status/`). `status`: queued, running,
    done or failed (then `error` names the file and what was wrong)."""

    id: UUID
    m_id: UUID
    name: str
    is_downloading: bool
    download_percentage: int | None = None
    download_elapsed: str | None = None
    download_remaining: str | None = None
    download_throughput: str | None = None
    download: bool | None = None
    dl_requested_at: datetime | None = None
    storage_location: str | None = None
    download_node: str | None = None
    download_speed: float | None = None
    download_eta: int | None = None
    size: int | None = None
    downloaded_bytes: int = 0
    status: str = "queued"
    error: str | None = None


class Variant(_Response):
    name: str
    files: list[str]
    size: int
    estimates: dict[str, int] = Field(default_factory=dict)
    fits: bool


class VariantList(_Response):
    repo_id: str
    revision: str | None = None
    variants: list[Variant]
    chosen: str
    reason: str
    largest_free_bytes: int
