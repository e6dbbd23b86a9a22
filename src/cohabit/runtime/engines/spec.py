"""LaunchSpec, what every launcher returns; LaunchTarget, what a backend tells a launcher
about where the engine runs; and the pieces launchers share: which devices a placement makes
visible and the optional HAMi-core hard limit. Pure; the spawner (and the pod builder) run
specs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from cohabit.hardware.model import Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.runtime.errors import LaunchError
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import MIB

LOCALHOST = "127.0.0.1"
ANY_HOST = "0.0.0.0"  # a pod listens on every interface


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """One engine command line: what to run, the environment it adds, where it answers.

    `env` holds only what the launcher adds to the spawner's environment. `health_url`
    answers 200 once the model is loaded; `base_url` is where OpenAI routes live (under
    `/v1`). `startup_timeout_s` is this engine's default time to become ready.
    """

    engine: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    port: int
    base_url: str
    health_url: str
    startup_timeout_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HardLimit:
    """HAMi-core enforcement for one launch: its preloaded library and this deployment's
    own shared-region file (HAMi-core counts every process that maps the same file against
    one limit, so two engines must never share one)."""

    library: str
    shared_cache: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchTarget:
    """Where and how an engine process runs: the only things a local process and a
    Kubernetes pod do differently. The flags that hold the engine inside its budget come
    from the `LaunchRequest` alone, so every backend gets the same ones.

    - `port`, `host`: where it listens (127.0.0.1 locally; 0.0.0.0 in a pod).
    - `executable`: the engine's program — vLLM's `vllm`, llama.cpp's `llama-server` (None:
      llama-cpp-python's server under `python`); MLX always runs under `python`.
    - `python`: the interpreter for Python-module engines.
    - `model_path`: the model as the process sees it (a pod's mount); None: the request's.
    - `device_env`: True: the launcher sets the vendor's visible-devices variables from the
      placement; False: something else does (a device plugin's `Allocate` answer).
    - `hard_limit`: HAMi-core enforcement (vLLM and llama.cpp on NVIDIA), or None.
    - `vllm_kv_cache_bytes`: size vLLM by `--kv-cache-memory-bytes` when the deployment's
      settings do not choose (the server's default).
    """

    port: int
    host: str = LOCALHOST
    executable: str | None = None
    python: str = sys.executable
    model_path: str | None = None
    device_env: bool = True
    hard_limit: HardLimit | None = None
    vllm_kv_cache_bytes: bool = False

    def model(self, request: LaunchRequest) -> str:
        return self.model_path or request.model_path

    def url(self) -> str:
        """Where the engine answers, as a local client reaches it."""
        return base_url(self.port, LOCALHOST if self.host == ANY_HOST else self.host)

    def device_env_for(self, request: LaunchRequest) -> dict[str, str]:
        """The visible-devices variables (when this target sets them) plus the hard limit."""
        env = visible_devices(request) if self.device_env else {}
        if self.hard_limit is not None:
            env |= hard_limit_env(request, self.hard_limit)
        return env


def base_url(port: int, host: str = LOCALHOST) -> str:
    return f"http://{host}:{port}"


def visible_devices(request: LaunchRequest) -> dict[str, str]:
    """The env var that shows the engine only its placed devices: CUDA_VISIBLE_DEVICES for
    NVIDIA (a MIG slice by its UUID, the only way CUDA addresses one), HIP_VISIBLE_DEVICES
    for AMD; nothing for memory pools (Apple, CPU), whose engine sees the whole pool."""
    placement = request.placement
    slots = [a.slot for a in placement.allocations]
    if slots[0].kind is SlotKind.POOL:
        return {}
    ids: list[str] = []
    for slot in slots:
        if slot.kind is SlotKind.PARTITION:
            if not slot.gpu_uuid:
                raise LaunchError(
                    f"deployment {request.deployment_id!r}: {slot.location} has no UUID, "
                    "and a partition can only be selected by its UUID"
                )
            ids.append(slot.gpu_uuid)
        else:
            ids.append(str(slot.gpu_index))
    vendor = placement.gpu_vendor
    if vendor is Vendor.NVIDIA:
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
    if vendor is Vendor.AMD:
        return {"HIP_VISIBLE_DEVICES": ",".join(ids)}
    raise LaunchError(
        f"deployment {request.deployment_id!r}: cannot select {vendor.value} devices "
        f"({slots[0].location}) for an engine"
    )


def hard_limit_env(request: LaunchRequest, limit: HardLimit) -> dict[str, str]:
    """HAMi-core's in-process limit: preload its hook, cap each visible device at the
    budget and give the deployment its own shared region. NVIDIA only; the hook fails CUDA
    allocations past the limit, so an engine that overruns gets OOM instead of hurting its
    neighbours.

    Names from HAMi-core's source: `CUDA_DEVICE_MEMORY_LIMIT_<i>` per device ordinal as the
    process sees it (src/multiprocess/multiprocess_memory_limit.c, do_init_device_memory_limits;
    a size with an `m` suffix, whole MiB rounded down here) and
    `CUDA_DEVICE_MEMORY_SHARED_CACHE` for the region file (multiprocess_memory_limit.h,
    MULTIPROCESS_SHARED_REGION_CACHE_ENV; default /tmp/cudevshr.cache, shared by everyone).
    """
    if request.placement.gpu_vendor is not Vendor.NVIDIA:
        raise LaunchError(
            f"deployment {request.deployment_id!r}: the HAMi-core hard limit works on "
            f"NVIDIA GPUs only, not {request.placement.gpu_vendor.value}"
        )
    size = f"{request.budget_bytes // MIB}m"
    env = {"LD_PRELOAD": limit.library, "CUDA_DEVICE_MEMORY_SHARED_CACHE": limit.shared_cache}
    for ordinal in range(len(request.placement.allocations)):
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = size
    return env
