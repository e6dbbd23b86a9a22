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
from cohabit.hardware.slots import Slot, SlotKind
from cohabit.runtime.errors import LaunchError
from cohabit.runtime.interface import LaunchRequest, Milestone
from cohabit.units import MIB

# Each milestone of a load with the text of the engine's log line that marks it.
Markers = tuple[tuple[Milestone, str], ...]

LOCALHOST = "127.0.0.1"
ANY_HOST = "0.0.0.0"  # a pod listens on every interface


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """One engine command line: what to run, the environment it adds, where it answers.

    `env` holds only what the launcher sets (runtime/environment.py adds the rest). `health_url`
    answers 200 once the model is loaded; `base_url` is where OpenAI routes live (under
    `/v1`). `startup_timeout_s` is this engine's default time to become ready. `milestones`:
    the text of the log lines that mark this engine's load milestones (runtime/milestones.py).
    """

    engine: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    port: int
    base_url: str
    health_url: str
    startup_timeout_s: float
    milestones: Markers = ()


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


def option(flag: str, value: str) -> str:
    """`--flag=value`: one argument, so a value that comes from data (a served name, a model
    path, a config's dtype) is never read as a flag, even when it starts with `-`. Python's
    argparse takes it so (argparse.py, `_parse_optional` splits a long option at the first
    `=`), and so does vLLM's FlexibleArgumentParser, which normalises only the name before
    the `=` (vllm/utils/argparse_utils.py, `parse_args`)."""
    return f"{flag}={value}"


def path_argument(path: str) -> str:
    """A path as a positional argument no parser takes for a flag: `./-x` for a relative `-x`
    (the same file). Absolute paths, and every other path, pass unchanged."""
    return f"./{path}" if path.startswith("-") else path


def visible_devices(request: LaunchRequest) -> dict[str, str]:
    """The environment that shows the engine exactly its reserved devices, named by identity.

    NVIDIA: ``CUDA_VISIBLE_DEVICES`` lists the GPUs' ``GPU-…`` and the MIG slices' ``MIG-…``
    UUIDs (the CUDA Programming Guide, "CUDA Environment Variables": identifiers are indices
    or UUID strings as ``nvidia-smi -L`` prints them, MIG ones included). When a GPU's UUID is
    unknown every device goes by its index, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA
    numbers cards as NVML and nvidia-smi do (its default, FASTEST_FIRST, would put a 24 GB
    RTX 3090 on bus 02 before an 8 GB RTX 3060 Ti on bus 01). A MIG slice has no index CUDA
    accepts, so a slice without its UUID is a LaunchError.

    AMD: ``ROCR_VISIBLE_DEVICES``, read by the ROCm runtime under HIP (ROCR-Runtime
    core/runtime/amd_filter_device.cpp: tokens are ROCr enumeration indices or ``GPU-`` +
    the card's unique id in 16 upper-case hex digits), lists the GPUs' UUIDs, or their index
    where the UUID is unknown or the slot is a compute partition (the partitions of one card
    may share its unique id, which ROCr then refuses as ambiguous). HIP numbers what ROCr
    shows from 0, so ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` are set to those
    ordinals: a value inherited from the server cannot hide the device again, and vLLM's
    ROCm platform (vllm/platforms/rocm.py) requires the two to agree.

    Memory pools (CPU, Apple, unified) get nothing: their engine sees the whole pool.
    """
    placement = request.placement
    slots = [allocation.slot for allocation in placement.allocations]
    if slots[0].kind is SlotKind.POOL:
        return {}
    vendor = placement.gpu_vendor
    if vendor is Vendor.NVIDIA:
        return _cuda_devices(request, slots)
    if vendor is Vendor.AMD:
        return _rocr_devices(slots)
    raise LaunchError(
        f"deployment {request.deployment_id!r}: cannot select {vendor.value} devices "
        f"({slots[0].location}) for an engine"
    )


def _cuda_devices(request: LaunchRequest, slots: list[Slot]) -> dict[str, str]:
    for slot in slots:
        if slot.kind is SlotKind.PARTITION and not slot.device_uuid:
            raise LaunchError(
                f"deployment {request.deployment_id!r}: {slot.location} has no UUID, "
                "and CUDA can only select a MIG slice by its UUID (add it to the fleet file "
                "as the slice's 'uuid', from nvidia-smi -L)"
            )
    uuids = [slot.device_uuid for slot in slots if slot.device_uuid]
    if len(uuids) == len(slots):
        return {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(slot.gpu_index) for slot in slots),
    }


def _rocr_devices(slots: list[Slot]) -> dict[str, str]:
    ids = [
        slot.device_uuid if slot.kind is SlotKind.GPU and slot.device_uuid else str(slot.gpu_index)
        for slot in slots
    ]
    ordinals = ",".join(str(ordinal) for ordinal in range(len(slots)))
    return {
        "ROCR_VISIBLE_DEVICES": ",".join(ids),
        "HIP_VISIBLE_DEVICES": ordinals,
        "CUDA_VISIBLE_DEVICES": ordinals,
    }


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
