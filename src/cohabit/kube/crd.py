"""The `ModelDeployment` custom resource (cohabit.dev/v1alpha1): its spec and status as
pydantic models (the CRD's own schema lives in deploy/helm/cohabit/crds/, kept equal to these
by tests). The operator reads specs and writes statuses through them; the control plane reads
a status back into placement fields with `placement_fields()`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from cohabit.kube.errors import InvalidSpec
from cohabit.units import SizeError, parse_size

GROUP = "cohabit.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ("md", "mdep")

NO_FIT_ERROR = "NoFitError"  # last_error_code of a deployment that fits nowhere (docs/api.md)
INVALID_SPEC = "InvalidSpec"  # last_error_code of a spec that can never be served
# last_error_code of a call the API server refused (RBAC, a quota, admission): the message
# carries the server's own words; tried again, as an admin may grant what was missing.
API_ERROR = "KubernetesAPIError"
# last_error_code of an engine pod deleted from under a running deployment (a drain, an
# eviction, its node removed, `kubectl delete pod`): the runtime's code for an engine gone.
POD_LOST = "CONTAINER_EXITED"
TERMINATING = "Terminating"  # Ready's reason while an earlier generation's pod still goes
READY = "Ready"  # the condition `kubectl wait --for=condition=Ready` waits on
PLACED = "Placed"


class Phase(StrEnum):
    """Deployment statuses (docs/api.md), as `status.phase`."""

    REQUESTED = "REQUESTED"
    DEPLOYING = "DEPLOYING"
    INITIALIZING = "INITIALIZING"
    DEPLOYED = "DEPLOYED"
    STOPPED = "STOPPED"
    ERROR = "ERROR"
    FAILED = "FAILED"
    # `spec.state: paused`: the engine pod is gone and its budget free; the Service and the
    # resource stay, and `running` places it again (possibly elsewhere).
    PAUSED = "PAUSED"


class _Wire(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown spec fields are refused so a typo
    fails at once (the CRD schema refuses them too)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class EngineConfig(_Wire):
    """Engine settings that change the memory a deployment needs."""

    max_model_len: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    dtype: str = "auto"
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    extra_args: tuple[str, ...] = ()


class ClaimSource(_Wire):
    """A PersistentVolumeClaim in the ModelDeployment's namespace."""

    claim_name: str = Field(min_length=1)


class HostPathSource(_Wire):
    """A directory on the node (the node the placement chose)."""

    path: str = Field(pattern=r"^/")


class SecretKey(_Wire):
    name: str = Field(min_length=1)
    key: str = "token"


class HuggingFaceSource(_Wire):
    """A Hub repo that an init container downloads (`hf download`) before the engine
    starts: into `claimName` when set (kept across restarts), else into an emptyDir.
    `file`: the one file the engine loads (a GGUF for llama.cpp); all files when unset."""

    repo: str = Field(min_length=1, pattern=r"^[^/\s]+/[^/\s]+$")
    revision: str | None = None
    file: str | None = None
    claim_name: str | None = None
    token_secret: SecretKey | None = None


class ModelStorage(_Wire):
    """Where the engine's model files come from: exactly one of a PVC, a host path, or a
    Hugging Face download. The volume is mounted read-only at `mountPath` in the engine
    container; with a PVC or host path `spec.model` is the model's path inside it."""

    mount_path: str = Field(default="/models", pattern=r"^/")
    persistent_volume_claim: ClaimSource | None = None
    host_path: HostPathSource | None = None
    hugging_face: HuggingFaceSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelStorage:
        given = [
            name
            for name, value in (
                ("persistentVolumeClaim", self.persistent_volume_claim),
                ("hostPath", self.host_path),
                ("huggingFace", self.hugging_face),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of persistentVolumeClaim, hostPath, huggingFace"
                + (f" (got {', '.join(given)})" if given else "")
            )
        return self


class PinnedSlot(_Wire):
    """One device of a pinned placement: a GPU (`gpuIndex`), one of its partitions
    (`gpuIndex` + `partitionIndex`), or, both unset, the node's memory pool."""

    gpu_index: int | None = Field(default=None, ge=0)
    partition_index: int | None = Field(default=None, ge=0)


class PinnedPlacement(_Wire):
    """Where the control plane (`cohabit serve --backend kubernetes`) already reserved the
    budget: the operator plans only on these slots, so both ledgers agree, or records the
    NoFit when the cluster changed and they no longer fit."""

    node: str = Field(min_length=1)
    slots: tuple[PinnedSlot, ...] = ()


class Sizing(_Wire):
    """What admission sized (set by the control plane): the engine settings and the
    estimate, as the store keeps them. The operator launches the pod's engine with exactly
    these, so it gets the flags a local process would."""

    settings: dict[str, Any] = Field(default_factory=dict)
    estimate: dict[str, Any] | None = None


class ModelDeploymentSpec(_Wire):
    """What a user asks for. `vram` (a size such as "6GiB", per GPU) overrides the estimate;
    `placement` pins the node and devices (set by the control plane, rarely by hand)."""

    model: str = Field(min_length=1)
    engine: Literal["vllm", "llamacpp"] = "vllm"
    image: str | None = None
    config: EngineConfig = EngineConfig()
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    vram: str | None = None
    required_vendor: Literal["nvidia", "amd"] | None = None
    min_accel_version: str | None = None
    state: Literal["running", "paused", "stopped"] = "running"
    service_port: int = Field(default=8080, ge=1, le=65535)
    placement: PinnedPlacement | None = None
    storage: ModelStorage | None = None
    served_model_name: str | None = None
    sizing: Sizing | None = None

    @field_validator("vram")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                if parse_size(value, field="spec.vram") <= 0:
                    raise ValueError("spec.vram must be greater than zero")
            except SizeError as error:
                raise ValueError(str(error)) from error
        return value

    @property
    def vram_bytes(self) -> int | None:
        return None if self.vram is None else parse_size(self.vram, field="spec.vram")


class Condition(_Wire):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str


class NoFitStatus(_Wire):
    """The structured side of a NoFit (the sentence is in `lastErrorMessage`)."""

    reason: str
    message: str
    hint: str = ""
    requested_bytes: int = 0
    largest_free_bytes: int = 0
    largest_free_location: str | None = None
    # True when the request would not fit even on an empty cluster: not retried.
    permanent: bool = False


class ModelDeploymentStatus(_Wire):
    """What the operator records: the phase, where it landed, what went wrong."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True
    )

    phase: Phase = Phase.REQUESTED
    topology: str | None = None
    node: str | None = None
    gpu_indices: tuple[int, ...] = ()
    partition: str | None = None
    hardware_class: str | None = None
    sharing_class: str | None = None
    gpu_vendor: str | None = None
    allocated_bytes: int | None = None
    allocated_capacity_gb: int | None = None
    notices: tuple[str, ...] = ()
    pod_name: str | None = None
    service_name: str | None = None
    last_error_code: str | None = None
    last_error_message: str | None = None
    last_error_at: str | None = None
    no_fit: NoFitStatus | None = None
    conditions: tuple[Condition, ...] = ()
    observed_generation: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The status as the API server stores it. Cleared fields are sent as null, so a
        merge patch removes what a previous placement or error left."""
        return self.model_dump(by_alias=True, mode="json")

    def placement_fields(self) -> dict[str, object]:
        """The placement fields in the control plane's names (those of `Placement.fields()`
        plus topology and gpu_vendor): the seam `cohabit serve --backend kubernetes` reads."""
        return {
            "topology": self.topology,
            "node": self.node,
            "gpu_indices": list(self.gpu_indices),
            "partition": self.partition,
            "hardware_class": self.hardware_class,
            "sharing_class": self.sharing_class,
            "gpu_vendor": self.gpu_vendor,
            "allocated_bytes": self.allocated_bytes,
            "allocated_capacity_gb": self.allocated_capacity_gb,
            "notices": list(self.notices),
        }


def parse_spec(raw: object, *, name: str) -> ModelDeploymentSpec:
    """A spec from the API server's JSON; one line naming the bad field otherwise."""
    try:
        return ModelDeploymentSpec.model_validate(raw or {})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "spec"
        raise InvalidSpec(f"ModelDeployment {name}: spec.{where}: {first['msg']}") from None


def parse_status(raw: object) -> ModelDeploymentStatus:
    """A status as stored; fields we do not know (kopf's own) are ignored."""
    return ModelDeploymentStatus.model_validate(raw or {})


def placement_fields(status: object) -> dict[str, object]:
    """A ModelDeployment's `status` (the stored JSON) as the control plane's placement
    fields."""
    return parse_status(status).placement_fields()


def condition(
    type_: str, *, ok: bool, reason: str, message: str = "", now: datetime | None = None
) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        last_transition_time=timestamp(now),
    )


def timestamp(now: datetime | None = None, *, precise: bool = False) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times ("2026-11-30T06:00:00Z"); `precise`
    keeps the microseconds (an order between events of the same second)."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    if not precise:
        moment = moment.replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")
