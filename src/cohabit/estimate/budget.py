"""The other direction: given a per-GPU byte budget, the engine settings that keep a deployment
inside it — vLLM's --gpu-memory-utilization / --kv-cache-memory / --max-model-len, llama.cpp's
--n-gpu-layers / --ctx-size. The launcher calls these; a budget too small is a value
(`BudgetShortfall`), not an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from cohabit.estimate.engines import VLLM_BLOCK_SIZE
from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.estimate import Estimate, estimate_shape
from cohabit.estimate.kv import kv_bytes_for_tokens
from cohabit.estimate.settings import EngineSettings
from cohabit.estimate.shape import ModelShape
from cohabit.units import format_gib

UTILIZATION_DIGITS = 4
LLAMACPP_MIN_CTX = 2048  # llama.cpp's --fit lowers the context no further before offloading


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmLaunchSettings:
    """Flags that hold vLLM inside a budget. Pass either `gpu_memory_utilization` or
    `kv_cache_memory_bytes` (the latter skips vLLM's profiling-based sizing), plus
    `max_model_len`."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int
    max_model_len: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamacppLaunchSettings:
    """--n-gpu-layers and --ctx-size that fit, and the bytes they take on the GPU."""

    n_gpu_layers: int
    ctx_size: int
    gpu_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetShortfall:
    """The budget cannot hold even the smallest useful configuration."""

    budget_bytes: int
    needed_bytes: int
    reason: str

    @property
    def message(self) -> str:
        return (
            f"{self.reason}: needs {format_gib(self.needed_bytes, digits=2)}, "
            f"budget {format_gib(self.budget_bytes, digits=2)}"
        )


def vllm_settings_for_budget(
    estimate: Estimate, *, budget_bytes: int, device_total_bytes: int
) -> VllmLaunchSettings | BudgetShortfall:
    """vLLM settings for a per-GPU budget.

    vLLM accounts weights + activation peak + non-torch + KV inside total × utilization; the
    CUDA context and (before vLLM 0.19) CUDA graphs sit outside it, so they come off the budget
    first. KV gets the rest; max_model_len is the estimate's, or the longest whole number of
    16-token blocks the KV holds for `concurrency` sequences when that is shorter.

    Llama-3.1-8B, 24 GiB budget on an 80 GiB H100: 24 − 0.5 (context) − 0.15 (graphs) = 23.35
    GiB inside, utilization 0.2918; KV 23.35 − 14.96 − 4.96 − 0.16 = 3.28 GiB = 26,859 tokens,
    more than the 16,000 asked, so max_model_len stays 16,000.
    """
    if budget_bytes <= 0 or device_total_bytes <= 0:
        raise InvalidSetting("budget and device memory must be positive")
    if estimate.engine != "vllm":
        raise InvalidSetting(f"vllm settings asked for a {estimate.engine} estimate")
    parts = estimate.overhead_parts
    outside = parts.get("cuda_context", 0) + parts.get("cuda_graphs", 0)
    inside = min(budget_bytes, device_total_bytes) - outside
    fixed = estimate.weights_bytes + estimate.activation_bytes + parts.get("non_torch", 0)
    kv_bytes = inside - fixed
    per_token = estimate.kv_cache_bytes_per_token
    # hybrid models also keep a fixed state per sequence (Mamba / linear-attention layers)
    state = estimate.kv_cache_bytes // estimate.concurrency - kv_bytes_for_tokens(
        per_token, estimate.max_model_len, block_size=VLLM_BLOCK_SIZE
    )
    per_sequence_tokens = 0
    if per_token > 0 and kv_bytes > 0:
        per_sequence_tokens = max(0, kv_bytes // estimate.concurrency - max(0, state)) // per_token
    max_len = min(estimate.max_model_len, per_sequence_tokens // VLLM_BLOCK_SIZE * VLLM_BLOCK_SIZE)
    if max_len < VLLM_BLOCK_SIZE:
        needed = outside + fixed + VLLM_BLOCK_SIZE * estimate.kv_cache_bytes_per_token
        return BudgetShortfall(
            budget_bytes=budget_bytes,
            needed_bytes=needed,
            reason=f"{estimate.model}: weights, activations and one KV block do not fit",
        )
    scale = 10**UTILIZATION_DIGITS
    utilization = (inside * scale // device_total_bytes) / scale
    return VllmLaunchSettings(
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=kv_bytes,
        max_model_len=max_len,
        max_num_seqs=estimate.max_num_seqs,
        max_num_batched_tokens=estimate.max_num_batched_tokens,
    )


def llamacpp_settings_for_budget(
    shape: ModelShape,
    *,
    budget_bytes: int,
    ctx_size: int,
    min_ctx_size: int = LLAMACPP_MIN_CTX,
    kv_cache_dtype: str = "auto",
    flash_attn: bool = False,
) -> LlamacppLaunchSettings | BudgetShortfall:
    """llama.cpp settings for a per-GPU budget, the way its --fit works: keep every layer on
    the GPU and halve the context down to `min_ctx_size`; if that still does not fit, keep
    that context and move layers to the host until it does. n_gpu_layers = n_layer + 1 means
    the output layer is offloaded too."""
    if budget_bytes <= 0:
        raise InvalidSetting("budget must be positive")

    def gpu_bytes(layers: int, ctx: int) -> int:
        settings = EngineSettings(
            max_model_len=ctx,
            n_gpu_layers=layers,
            kv_cache_dtype=kv_cache_dtype,
            flash_attn=flash_attn,
        )
        est = estimate_shape(shape, engine="llamacpp", settings=settings)
        return est.total_bytes

    all_layers = shape.num_layers + 1
    floor_ctx = min(ctx_size, min_ctx_size)
    ctx = ctx_size
    while True:
        used = gpu_bytes(all_layers, ctx)
        if used <= budget_bytes:
            return LlamacppLaunchSettings(n_gpu_layers=all_layers, ctx_size=ctx, gpu_bytes=used)
        if ctx <= floor_ctx:
            break
        ctx = max(floor_ctx, ctx // 2)
    for layers in range(all_layers - 1, -1, -1):
        used = gpu_bytes(layers, ctx)
        if used <= budget_bytes:
            return LlamacppLaunchSettings(n_gpu_layers=layers, ctx_size=ctx, gpu_bytes=used)
    return BudgetShortfall(
        budget_bytes=budget_bytes,
        needed_bytes=gpu_bytes(0, ctx),
        reason=f"{shape.name}: the compute buffer and backend alone do not fit",
    )
