"""vLLM launcher: `vllm serve` held inside the reserved budget (pure; the backends run it).

The budget becomes --gpu-memory-utilization (budget ÷ the device's total as vLLM sees it; a
MIG slice is its own total) or, when asked for, --kv-cache-memory-bytes, which sizes the KV
cache in bytes and ignores what neighbours hold. --max-model-len, --max-num-seqs and
--max-num-batched-tokens are always the ones the estimate was made with, and --dtype,
--quantization and --kv-cache-dtype are passed whenever the deployment set them, so vLLM runs
the configuration the budget was sized for.

Every flag is vLLM's own spelling in vllm/engine/arg_utils.py (`EngineArgs.add_cli_args`:
--dtype, --max-model-len, --quantization, --enforce-eager, --served-model-name,
--tensor-parallel-size, --gpu-memory-utilization, --kv-cache-memory-bytes, --kv-cache-dtype,
--max-num-batched-tokens, --max-num-seqs); --host and --port are the OpenAI server's
(`FrontendArgs` in vllm/entrypoints/openai/cli_args.py). Values that come from data — the
served name and the config's dtype, quantization and KV cache dtype — go as `--flag=value`
(`spec.option`), and the model path, which `vllm serve` takes only as its first positional
argument (vllm/utils/argparse_utils.py moves even `--model=` there), never starts with `-`
(`spec.path_argument`).

A deployment that may sleep when idle (`LaunchRequest.sleep_mode`) on an NVIDIA GPU also gets
--enable-sleep-mode (`ModelConfig.enable_sleep_mode` in vllm/config/model.py, turned into a
flag by `EngineArgs.add_cli_args`) and VLLM_SERVER_DEV_MODE=1 (vllm/envs.py), without which
the server registers no /sleep, /wake_up or /is_sleeping route
(vllm/entrypoints/serve/sleep/api_router.py, `attach_router`). vLLM accepts the flag only
where `Platform.is_sleep_mode_available()` says so (vllm/platforms/interface.py: CUDA, and
ROCm, where it works on MI300-class cards only), so AMD engines keep today's unload.

The load's milestones (`MILESTONES`) are the lines the model runner logs around loading the
weights (vllm/v1/worker/gpu_model_runner.py, `GPUModelRunner.load_model`): `Starting to load
model M...` once the engine core's process has imported vLLM, set up the device and starts
reading the checkpoint, and `Model loading took X GiB memory and S seconds` once the weights
are on the device; profiling, the KV cache and CUDA graphs come after. With tensor
parallelism every worker loads its shard; the first line of each kind counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohabit.estimate.budget import BudgetShortfall, vllm_settings_for_budget
from cohabit.estimate.settings import KvSizing
from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.runtime.engines.spec import (
    LaunchSpec,
    LaunchTarget,
    Markers,
    option,
    path_argument,
)
from cohabit.runtime.errors import BudgetTooSmall, LaunchError
from cohabit.runtime.interface import LaunchRequest, Milestone

ENGINE = "vllm"
EXECUTABLE = "vllm"
STARTUP_TIMEOUT_S = 1200.0  # weights from disk plus profiling and CUDA graphs on a big model
# vLLM's own default headroom: the CUDA context and other processes' driver memory live
# outside the fraction, so a whole card or slice is never handed over at 1.0.
MAX_UTILIZATION = 0.92
_UTILIZATION_SCALE = 10_000  # four decimal places, rounded down so the budget is not exceeded
_NOT_A_METHOD = ("auto", "none")  # our quantization words that mean "vLLM's default"
MILESTONES: Markers = (
    (Milestone.ENGINE_IMPORTED, "Starting to load model "),
    (Milestone.WEIGHTS_LOADED, "Model loading took "),
)
SLEEP_MODE_FLAG = "--enable-sleep-mode"
# vLLM registers its sleep routes only in its development mode (vllm/envs.py).
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmSizing:
    """The memory flags of one launch (None: not passed, vLLM's default applies)."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None


def sizing(request: LaunchRequest) -> VllmSizing:
    """The memory flags for `request`: from its estimate through `vllm_settings_for_budget`,
    or, without one (the caller gave the bytes), budget ÷ device total and the configured
    limits. Llama-3.1-8B with 24 GiB on an 80 GiB H100: utilization 0.2918, max_model_len
    16,000 (see budget.py).

    Raises LaunchError (BudgetTooSmall when the budget cannot hold one KV block).
    """
    if request.budget_bytes <= 0 or request.device_total_bytes <= 0:
        raise LaunchError(
            f"deployment {request.deployment_id!r}: budget and device memory must be positive"
        )
    estimate, settings = request.estimate, request.settings
    if estimate is None:
        utilization = request.budget_bytes * _UTILIZATION_SCALE // request.device_total_bytes
        return VllmSizing(
            gpu_memory_utilization=min(utilization / _UTILIZATION_SCALE, MAX_UTILIZATION),
            kv_cache_memory_bytes=None,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
        )
    fit = vllm_settings_for_budget(
        estimate, budget_bytes=request.budget_bytes, device_total_bytes=request.device_total_bytes
    )
    if isinstance(fit, BudgetShortfall):
        raise BudgetTooSmall(f"deployment {request.deployment_id!r}: {fit.message}")
    return VllmSizing(
        gpu_memory_utilization=min(fit.gpu_memory_utilization, MAX_UTILIZATION),
        kv_cache_memory_bytes=fit.kv_cache_memory_bytes,
        max_model_len=fit.max_model_len,
        max_num_seqs=fit.max_num_seqs,
        max_num_batched_tokens=fit.max_num_batched_tokens,
    )


def kv_cache_bytes_mode(request: LaunchRequest, target: LaunchTarget) -> bool:
    """Whether this launch sizes vLLM by --kv-cache-memory-bytes: the deployment's choice,
    else the server's."""
    chosen = request.settings.kv_sizing
    if chosen is None:
        return target.vllm_kv_cache_bytes
    return chosen is KvSizing.BYTES


def can_sleep(request: LaunchRequest) -> bool:
    """Whether this launch starts vLLM able to sleep: the deployment allows it and the
    placement is an NVIDIA GPU (CUDA's allocator is what sleep mode hands memory back with)."""
    placement = request.placement
    return (
        request.sleep_mode
        and placement.gpu_vendor is Vendor.NVIDIA
        and placement.hardware_class is not HardwareClass.CPU
    )


def engine_args(request: LaunchRequest, target: LaunchTarget) -> list[str]:
    """`vllm serve`'s arguments after the subcommand (the model first)."""
    settings = request.settings
    sized = sizing(request)
    args = [
        path_argument(target.model(request)),
        "--host",
        target.host,
        "--port",
        str(target.port),
        option("--served-model-name", request.served_model_name),
        "--tensor-parallel-size",
        str(len(request.placement.allocations)),
    ]
    if kv_cache_bytes_mode(request, target) and sized.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(sized.kv_cache_memory_bytes)]
    else:
        args += ["--gpu-memory-utilization", f"{sized.gpu_memory_utilization:g}"]
    for flag, value in (
        ("--max-model-len", sized.max_model_len),
        ("--max-num-seqs", sized.max_num_seqs),
        ("--max-num-batched-tokens", sized.max_num_batched_tokens),
    ):
        if value is not None:
            args += [flag, str(value)]
    if settings.dtype != "auto":
        args.append(option("--dtype", settings.dtype))
    if settings.quantization not in _NOT_A_METHOD:
        args.append(option("--quantization", settings.quantization))
    if settings.kv_cache_dtype != "auto":
        args.append(option("--kv-cache-dtype", settings.kv_cache_dtype))
    if settings.enforce_eager:
        args.append("--enforce-eager")
    if can_sleep(request):
        args.append(SLEEP_MODE_FLAG)
    return [*args, *request.extra_args]


def build_launch(request: LaunchRequest, target: LaunchTarget) -> LaunchSpec:
    """The `vllm serve` command for `request` at `target`.

    Raises LaunchError (BudgetTooSmall when the budget cannot hold one KV block).
    """
    argv = [target.executable or EXECUTABLE, "serve", *engine_args(request, target)]
    url = target.url()
    env = target.device_env_for(request)
    if can_sleep(request):
        env |= DEV_MODE_ENV
    return LaunchSpec(
        engine=ENGINE,
        argv=tuple(argv),
        env=env,
        port=target.port,
        base_url=url,
        health_url=f"{url}/health",
        startup_timeout_s=STARTUP_TIMEOUT_S,
        milestones=MILESTONES,
    )
