"""The seam between the control plane and whatever runs engines.

The reconciler (service/) calls an `EngineRuntime`: the local process spawner on standalone
hosts, ModelDeployments on Kubernetes, or an in-process double in tests. It hands over a
`LaunchRequest` built from a committed placement and gets back an `EngineHandle` it stores,
then polls `status()` until READY or FAILED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from cohabit.estimate.estimate import Estimate
from cohabit.estimate.settings import EngineSettings
from cohabit.placement.decision import Placement


class EngineState(StrEnum):
    STARTING = "starting"  # process is up, not answering yet (deployment INITIALIZING)
    READY = "ready"  # health endpoint answers (deployment DEPLOYED)
    FAILED = "failed"  # exited or never became ready; see error_code
    STOPPED = "stopped"  # stopped on request


class Milestone(StrEnum):
    """A moment of an engine's load that its own log reveals (each launcher names the lines
    that mark it: `LaunchSpec.milestones`). Values are the timeline's event kinds."""

    ENGINE_IMPORTED = "engine_imported"  # its code is imported: it starts reading the model
    WEIGHTS_LOADED = "weights_loaded"  # its weights are in memory


@dataclass(frozen=True, slots=True, kw_only=True)
class MilestoneSeen:
    """A milestone as the runtime first saw it in the engine's log, at one of its polls."""

    milestone: Milestone
    at: datetime  # UTC: the poll that first found the line (not when the engine wrote it)
    line: str  # the engine's line that marks it


class RuntimeErrorCode(StrEnum):
    """`last_error_code` values a runtime failure records (docs/api.md)."""

    OOM = "OOM"
    CUDA_ERROR = "CUDA_ERROR"
    MODEL_LOADING_FAILURE = "MODEL_LOADING_FAILURE"
    CONTAINER_EXITED = "CONTAINER_EXITED"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    STARTUP_TIMEOUT = "STARTUP_TIMEOUT"
    MUST_REDOWNLOAD = "MUST_REDOWNLOAD"


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    """Everything needed to start one deployment's engine inside its reserved budget.

    `budget_bytes` is per device; `device_total_bytes` is the device's full memory (what
    vLLM's --gpu-memory-utilization is a fraction of). `settings` are the engine settings
    admission parsed and `estimate` what it sized them at (None when the caller gave the
    bytes itself): launchers turn exactly these into flags and never estimate with others.
    `sleep_mode`: the deployment may be put to sleep when idle instead of being stopped; an
    engine that can sleep on the placed hardware is started so that it can (vLLM on NVIDIA
    GPUs, runtime/sleep.py), the others ignore it.
    """

    deployment_id: str
    engine: str  # "vllm" | "llamacpp" | "mlx"; "auto" or "" lets the runtime choose
    model_path: str  # local file or directory (a .gguf, or config + safetensors)
    served_model_name: str
    placement: Placement
    budget_bytes: int
    device_total_bytes: int
    settings: EngineSettings = field(default_factory=EngineSettings)
    estimate: Estimate | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    sleep_mode: bool = False

    @classmethod
    def inside(
        cls,
        placement: Placement,
        *,
        deployment_id: str,
        engine: str,
        model_path: str,
        served_model_name: str,
        settings: EngineSettings,
        estimate: Estimate | None,
        extra_args: tuple[str, ...] = (),
        sleep_mode: bool = False,
    ) -> LaunchRequest:
        """The launch of an engine inside `placement`, as the local reconciler and the
        Kubernetes operator both make it: the budget is what the placement allocated on each
        device, so the shared launcher gives the engine the same flags on either backend."""
        return cls(
            deployment_id=deployment_id,
            engine=engine,
            model_path=model_path,
            served_model_name=served_model_name,
            placement=placement,
            budget_bytes=placement.allocated_bytes,
            device_total_bytes=placement.first.total_bytes,
            settings=settings,
            estimate=estimate,
            extra_args=extra_args,
            sleep_mode=sleep_mode,
        )

    @property
    def max_model_len(self) -> int | None:
        """The context the deployment was sized for: the estimate's (the model's own when
        the config set none), else the configured one."""
        if self.estimate is not None:
            return self.estimate.max_model_len
        return self.settings.max_model_len


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineHandle:
    """What the store keeps about a started engine, enough to find it again after a restart."""

    deployment_id: str
    pid: int | None = None
    port: int | None = None
    base_url: str | None = None  # e.g. http://127.0.0.1:41234 (OpenAI routes under /v1)
    log_path: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStatus:
    state: EngineState
    error_code: RuntimeErrorCode | None = None
    error_message: str | None = None  # the engine's own line that explains the failure
    error_at: datetime | None = None  # when the runtime saw the failure (UTC; last_error_at)
    exit_code: int | None = None  # the process's exit status (negative: killed by signal N)
    # The engine's process once it runs: an engine held behind another start-up has none in
    # the handle `start()` returned, so the caller refreshes its stored handle from here.
    pid: int | None = None
    # The milestones of this run's load seen in its log so far, in the order seen (none for
    # an engine whose log shows none, or one adopted after a restart).
    milestones: tuple[MilestoneSeen, ...] = ()


class EngineRuntime(Protocol):
    """Starts, watches and stops engines. Implementations must be safe to call from the
    reconciler's thread; `start` returns at once (readiness comes through `status`)."""

    def start(self, request: LaunchRequest) -> EngineHandle: ...

    def status(self, handle: EngineHandle) -> EngineStatus: ...

    def stop(self, handle: EngineHandle) -> None: ...

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        """After a control-plane restart: the engine's handle as the runtime knows it (its
        port and URL, which `handle` may lack) when it is still running and ours; else None."""
        ...

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]: ...

    def engines(self) -> list[EngineHandle]:
        """Every engine this runtime can find running, whoever started it: after a crash the
        control plane stops those whose deployment has ended."""
        ...

    def discard(self, deployment_id: str) -> None:
        """Delete what the runtime keeps of an ended engine (its logs); called when the
        deployment's record is purged. A live engine's files are kept."""
        ...


def handle_to_json(handle: EngineHandle) -> dict[str, Any]:
    """The handle as the store keeps it (the deployment's `engine_handle` column)."""
    return {
        "deployment_id": handle.deployment_id,
        "pid": handle.pid,
        "port": handle.port,
        "base_url": handle.base_url,
        "log_path": handle.log_path,
    }


def handle_from_json(data: Mapping[str, Any] | None) -> EngineHandle | None:
    if not data:
        return None
    return EngineHandle(
        deployment_id=str(data["deployment_id"]),
        pid=data.get("pid"),
        port=data.get("port"),
        base_url=data.get("base_url"),
        log_path=data.get("log_path"),
    )
