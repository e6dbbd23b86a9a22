"""vLLM launcher: `vllm serve` held inside the reserved budget (pure; the spawner runs it).

The budget becomes --gpu-memory-utilization (budget ÷ the device's total as vLLM sees it; a
MIG slice is its own total) or, where the installed vLLM has it, --kv-cache-memory, which
sizes the KV cache in bytes and ignores what neighbours hold. Either way --max-model-len is
set, so vLLM does not refuse to start for a context the budget cannot hold.
"""

from __future__ import annotations

from cohabit.estimate.budget import BudgetShortfall, vllm_settings_for_budget
from cohabit.estimate.estimate import Estimate
from cohabit.runtime.engines.spec import (
    LOCALHOST,
    LaunchSpec,
    base_url,
    hard_limit_env,
    visible_devices,
)
from cohabit.runtime.errors import BudgetTooSmall, LaunchError
from cohabit.runtime.interface import LaunchRequest

ENGINE = "vllm"
STARTUP_TIMEOUT_S = 1200.0  # weights from disk plus profiling and CUDA graphs on a big model
# vLLM's own default headroom: the CUDA context and other processes' driver memory live
# outside the fraction, so a whole card or slice is never handed over at 1.0.
MAX_UTILIZATION = 0.92
_UTILIZATION_SCALE = 10_000  # four decimal places, rounded down so the budget is not exceeded


def build_launch(
    request: LaunchRequest,
    *,
    port: int,
    estimate: Estimate | None = None,
    kv_cache_memory: bool = False,
    hard_limit_library: str | None = None,
    executable: str = "vllm",
) -> LaunchSpec:
    """The `vllm serve` command for `request` on `port`.

    With an `estimate` (engine "vllm", the deployment's settings) the flags come from
    `vllm_settings_for_budget`; without one, utilization is budget ÷ device total and the
    context is the request's. Llama-3.1-8B with 24 GiB on an 80 GiB H100: utilization
    0.2918, max_model_len 16,000 (see budget.py).

    Raises LaunchError (BudgetTooSmall when the budget cannot hold one KV block).
    """
    if request.budget_bytes <= 0 or request.device_total_bytes <= 0:
        raise LaunchError(
            f"deployment {request.deployment_id!r}: budget and device memory must be positive"
        )
    tensor_parallel = len(request.placement.allocations)
    max_model_len = request.max_model_len
    kv_cache_bytes: int | None = None
    if estimate is None:
        utilization = request.budget_bytes * _UTILIZATION_SCALE // request.device_total_bytes
        gpu_memory_utilization = utilization / _UTILIZATION_SCALE
    else:
        settings = vllm_settings_for_budget(
            estimate,
            budget_bytes=request.budget_bytes,
            device_total_bytes=request.device_total_bytes,
        )
        if isinstance(settings, BudgetShortfall):
            raise BudgetTooSmall(f"deployment {request.deployment_id!r}: {settings.message}")
        gpu_memory_utilization = settings.gpu_memory_utilization
        kv_cache_bytes = settings.kv_cache_memory_bytes
        max_model_len = settings.max_model_len
    argv = [
        executable,
        "serve",
        request.model_path,
        "--host",
        LOCALHOST,
        "--port",
        str(port),
        "--served-model-name",
        request.served_model_name,
        "--tensor-parallel-size",
        str(tensor_parallel),
    ]
    if kv_cache_memory and kv_cache_bytes is not None:
        argv += ["--kv-cache-memory", str(kv_cache_bytes)]
    else:
        argv += ["--gpu-memory-utilization", f"{min(gpu_memory_utilization, MAX_UTILIZATION):g}"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    env = visible_devices(request)
    if hard_limit_library:
        env |= hard_limit_env(request, hard_limit_library)
    return LaunchSpec(
        engine=ENGINE,
        argv=(*argv, *request.extra_args),
        env=env,
        port=port,
        base_url=base_url(port),
        health_url=f"{base_url(port)}/health",
        startup_timeout_s=STARTUP_TIMEOUT_S,
    )
