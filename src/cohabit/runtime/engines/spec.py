"""LaunchSpec, what every launcher returns, and the pieces launchers share: which devices a
placement makes visible and the optional HAMi-core hard limit. Pure; the spawner runs specs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cohabit.hardware.model import Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.runtime.errors import LaunchError
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import MIB

LOCALHOST = "127.0.0.1"


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


def hard_limit_env(request: LaunchRequest, library: str) -> dict[str, str]:
    """HAMi-core's in-process limit: preload its hook and cap each visible device at the
    budget, in whole MiB rounded down (HAMi writes `<MiB>m`). NVIDIA only; the hook fails
    CUDA allocations past the limit, so an engine that overruns gets OOM instead of hurting
    its neighbours."""
    if request.placement.gpu_vendor is not Vendor.NVIDIA:
        raise LaunchError(
            f"deployment {request.deployment_id!r}: the HAMi-core hard limit works on "
            f"NVIDIA GPUs only, not {request.placement.gpu_vendor.value}"
        )
    limit = f"{request.budget_bytes // MIB}m"
    env = {"LD_PRELOAD": library}
    for ordinal in range(len(request.placement.allocations)):
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = limit
    return env
