"""Request and response bodies, wire-compatible with the serving API the `kamiwaza-sdk`
client speaks (docs/api.md; docs/sdk.md). Pydantic lives only in the api
schema modules (this one, auth_schemas, cluster_schemas) and in settings; routers map records
to these explicitly."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator

from cohabit.service.api.fields import ByteCount, Count, Fraction, JsonObject, LocalPath, Name, Text
from cohabit.store.records import (
    KEEP_ALIVE_S,
    MAX_COPIES,
    MAX_DURATION_MIN,
    MAX_KEEP_ALIVE_S,
    NEVER,
    PRIORITY_RANGE,
)

_INT64 = 2**63 - 1  # counts kept in JSON that other tools read as 64-bit integers


class CreateModelDeployment(BaseModel):
    """Body of deploy_model and estimate_model_vram. Unknown fields are ignored (newer
    clients send more than we read)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    m_id: UUID
    m_file_id: UUID | None = None
    m_config_id: UUID | None = None
    engine_name: Name | None = None
    duration: Count | None = Field(
        default=None,
        ge=1,
        le=MAX_DURATION_MIN,
        description="Minutes from the request until it is stopped; null: until stopped.",
    )
    min_copies: Count = Field(
        default=1, ge=0, le=MAX_COPIES, description="0: unloaded when idle, loaded on demand."
    )
    starting_copies: Count = Field(
        default=1,
        ge=0,
        le=MAX_COPIES,
        validate_default=True,  # checked against min_copies even when not given
        description="Engines started at deploy, each on its own budget, spread across "
        "devices; 0 (with min_copies 0): admitted UNLOADED.",
    )
    max_copies: Count | None = Field(
        default=None,
        ge=1,
        le=MAX_COPIES,
        description="Autoscaling adds copies up to this many under load (null: no more than "
        "starting_copies).",
    )
    keep_alive: Count = Field(
        default=KEEP_ALIVE_S,
        ge=NEVER,
        le=MAX_KEEP_ALIVE_S,
        description="Idle seconds before a min_copies 0 deployment is unloaded; -1: never.",
    )
    priority: Count = Field(default=0, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    queue: StrictBool = Field(default=False, description="Wait for room instead of failing.")
    location: Name | None = None
    lb_port: Count = Field(default=0, ge=0, le=65535)
    autoscaling: StrictBool = False
    force_cpu: StrictBool = False
    node_resource_type: Name | None = None
    max_concurrent_requests: Count | None = Field(default=None, ge=0, le=_INT64)
    vram_allocation: ByteCount | None = Field(
        default=None, description="Bytes per device; overrides the estimate when ≥ 1."
    )
    gpu_allocation: Fraction | None = Field(default=None, ge=0, le=1024, allow_inf_nan=False)
    inference_resources: JsonObject | None = Field(default=None, alias="inferenceResources")
    over_budget: Literal["warn", "restart", "stop"] = Field(
        default="warn",
        description="When the engine's measured memory passes its budget (plus the server's "
        "tolerance): warn (an event and a health entry), restart it, or stop it.",
    )

    @field_validator("starting_copies")
    @classmethod
    def _starting_within(cls, value: int, info: ValidationInfo) -> int:
        least = info.data.get("min_copies")
        if least is not None and value < least:
            raise ValueError(f"starting_copies {value} is below min_copies {least}")
        return value

    @field_validator("max_copies")
    @classmethod
    def _max_within(cls, value: int | None, info: ValidationInfo) -> int | None:
        for lower in ("min_copies", "starting_copies"):
            least = info.data.get(lower)
            if value is not None and least is not None and value < least:
                raise ValueError(f"max_copies {value} is below {lower} {least}")
        return value


class ModelInstance(BaseModel):
    id: UUID
    deployment_id: UUID
    deployed_at: datetime
    container_id: str | None = None
    node_id: UUID | None = None
    host_name: str | None = None
    listen_port: int | None = None
    status: str
    extra_details: dict[str, Any] = Field(default_factory=dict)


class NoFitDetails(BaseModel):
    model_config = ConfigDict(extra="allow")

    reason: str
    message: str


class LoadProgress(BaseModel):
    """A load under way (service/control/loadphases.py): its current phase and how long it
    has lasted, and the phases this load has finished."""

    phase: str = Field(
        description="placing, starting, engine_load (its parts not shown yet), weights_load "
        "or engine_warmup."
    )
    elapsed_s: float = Field(description="Seconds the current phase has lasted, at `as_of`.")
    since: datetime = Field(description="When the current phase began.")
    began_at: datetime = Field(description="When this load was asked for.")
    as_of: datetime = Field(description="When this answer was made.")
    phases_s: dict[str, float] = Field(
        default_factory=dict, description="The finished phases of this load, in seconds."
    )


class Deployment(CreateModelDeployment):
    """`UIModelDeployment` plus every placement field; `allocated_bytes`, `requested_bytes`,
    `gpu_indices`, `partition`, `no_fit` and `estimate` go beyond the anchor."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)

    id: UUID
    m_config_id: UUID
    m_name: str
    status: str
    requested_at: datetime
    deployed_at: datetime | None = None
    stopped_at: datetime | None = None
    last_error_code: str | None = None
    last_error_message: str | None = None
    last_error_at: datetime | None = None
    instances: list[ModelInstance] = Field(
        default_factory=list, description="One per copy with a started engine."
    )
    copies: int = Field(default=0, description="Its copies now (not ended), copy 0 included.")
    ready_copies: int = Field(default=0, description="Its copies that serve now.")
    serve_path: str | None = None
    access_path: str | None = Field(
        default=None, description="The gateway route: /runtime/models/{id} (OpenAI under /v1)."
    )
    endpoint: str | None = Field(
        default=None, description="Full URL of its OpenAI base: …/runtime/models/{id}/v1."
    )
    single_node_mode: bool = True
    topology: str | None = None
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
    requested_bytes: int
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int
    sub_mode: str | None = None
    spawner_process: dict[str, Any] | None = None
    health_details: dict[str, Any] = Field(default_factory=dict)
    notices: list[str] = Field(default_factory=list)
    no_fit: NoFitDetails | None = None
    estimate: dict[str, Any] | None = None
    ends_at: datetime | None = Field(default=None, description="When its duration ends.")
    last_used_at: datetime | None = Field(
        default=None, description="Its last request through the gateway, as last recorded."
    )
    memory_used_bytes: int | None = Field(
        default=None, description="The engine's memory at the meter's last sample."
    )
    memory_sampled_at: datetime | None = None
    loading: LoadProgress | None = Field(
        default=None,
        description="While it loads (REQUESTED, DEPLOYING, INITIALIZING): the current phase "
        "of the load and its finished phases; null otherwise.",
    )


class ContainerLogResponse(BaseModel):
    deployment_id: UUID
    engine_type: str | None
    container_id: str | None = None
    log_file_path: str
    logs: list[str]
    total_lines_seen: int
    current_lines_stored: int
    compressed: bool = False
    capture_active: bool


class ContainerLogPatternResponse(BaseModel):
    """Failure patterns found in the log tail; informational, never changes a status."""

    deployment_id: UUID
    patterns_detected: dict[str, bool]
    analysis_timestamp: datetime
    failure_lines: list[dict[str, str]]


class ContainerLogListResponse(BaseModel):
    """The log files one engine wrote, one entry per deployment (all values strings)."""

    engine_type: str
    logs: list[dict[str, str]]


class DeploymentEvent(BaseModel):
    """One step of a deployment's timeline (docs/api.md, "Events")."""

    id: int = Field(description="Increasing; pass the last one seen as `after` to resume.")
    at: datetime
    kind: str = Field(description="requested, placed, reserved, started, healthy, failed, …")
    message: str
    data: dict[str, Any] | None = None


class DeploymentEvents(BaseModel):
    """A page of a deployment's timeline, oldest first, and where it stands now."""

    deployment_id: UUID
    status: str = Field(description="The deployment's status when the page was read.")
    ended: bool = Field(description="It has ended: nothing but a late last event will follow.")
    events: list[DeploymentEvent]
    cursor: int = Field(description="The last event id of this page (`after` when it is empty).")


class VramEstimate(BaseModel):
    model_config = ConfigDict(extra="allow")

    computed_vram_estimate: float
    highest_node_vram: float
    estimation_source: str


class ModelFile(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    id: UUID
    name: str
    size: int | None
    storage_type: str
    storage_host: str = "localhost"
    storage_location: str | None
    hub: str | None
    m_id: UUID = Field(alias="model_id")
    created_timestamp: datetime


class CreateModelFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: Name | None = None
    storage_type: Name | None = None
    storage_location: LocalPath | None = None


class CreateModel(BaseModel):
    """Register a model: `path` (ours) or a file's local `storage_location`, else
    `repo_modelId` from the Hugging Face Hub (or its local cache)."""

    model_config = ConfigDict(extra="ignore")

    name: Name | None = None
    repo_modelId: Name | None = None  # noqa: N815 - the wire name
    path: LocalPath | None = None
    source_repository: LocalPath | None = None  # a repo id, a URL or a local path
    description: Text | None = None
    m_files: list[CreateModelFile] = Field(default_factory=list, max_length=10_000)


class Model(BaseModel):
    id: UUID
    repo_modelId: str | None  # noqa: N815 - the wire name
    name: str
    modelfamily: str | None = None
    purpose: str | None = None
    version: str | None = None
    author: str | None = None
    source_repository: str | None = None
    hub: str | None = None
    description: str | None = None
    private: bool = False
    hosted: str = "local"
    format: str
    model_path: str | None
    m_files: list[ModelFile]
    default_config: dict[str, Any] | None = None
    created_timestamp: datetime
    modified_timestamp: datetime
    files_being_downloaded: list[ModelFile] = Field(default_factory=list)


class ModelRemoved(BaseModel):
    id: UUID
    deleted: bool
    deployments_removed: int
    files_deleted: list[str]
    files_kept: list[str]
    files_kept_reason: str | None = None


class CreateModelConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    m_id: UUID
    m_file_id: UUID | None = None
    name: Name | None = None
    default: bool
    description: Text | None = None
    config: JsonObject = Field(default_factory=dict)
    system_config: JsonObject = Field(default_factory=dict)


class ModelConfig(CreateModelConfig):
    id: UUID
    kamiwaza_version: str | None = None
    created_at: datetime
    modified_at: datetime | None = None


class ErrorMessage(BaseModel):
    """401 (token), 403 (Host), 404 (unknown id), 503: one sentence."""

    detail: str


class Problem(BaseModel):
    """One problem of a 422: where (`["body", "name"]`), what, and its kind."""

    model_config = ConfigDict(extra="allow")

    loc: list[str | int]
    msg: str
    type: str


class InvalidRequest(BaseModel):
    """422: the body, a parameter, or what they name cannot be served as written."""

    detail: list[Problem]


class NoFitError(BaseModel):
    """409: it cannot fit even on the empty fleet; the structured NoFit."""

    detail: NoFitDetails


_ANSWERS: dict[int, tuple[type[BaseModel], str]] = {
    400: (ErrorMessage, "The body is not text that JSON can be read from."),
    401: (ErrorMessage, "Missing or wrong bearer token (when the server has one)."),
    403: (
        ErrorMessage,
        "A Host the server does not answer (when it has no token), or a user token on a "
        "route that needs an admin.",
    ),
    404: (ErrorMessage, "No such model, config, file or deployment."),
    409: (NoFitError, "Bigger than every device of the fleet."),
    422: (InvalidRequest, "The request cannot be served as written."),
}


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route or router, for its OpenAPI `responses`."""
    return {
        code: {"model": model, "description": description}
        for code, (model, description) in _ANSWERS.items()
        if code in codes
    }


GUARDED = answers(401, 403)  # every route behind the token (and the Host check)


# 409 of the routes that delete what is still in use (not a NoFit).
IN_USE: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorMessage, "description": "Still used by an active deployment."}
}
# 409 of the routes that make something named: the name is taken, or the server has no token.
TAKEN: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorMessage, "description": "Cannot be done on this server now (one line)."}
}
# 502 and 503 of the routes that ask the Hugging Face Hub: it answered what is refused, or it
# cannot be reached (or offline mode).
HUB_DOWN: dict[int | str, dict[str, Any]] = {
    502: {
        "model": ErrorMessage,
        "description": "The Hub answered what cannot be stored safely (names the field).",
    },
    503: {"model": ErrorMessage, "description": "The Hugging Face Hub cannot be reached."},
}
