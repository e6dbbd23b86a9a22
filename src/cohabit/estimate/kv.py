"""KV-cache bytes: per token and per GPU as vLLM pages it (MHA, GQA, MLA, sliding-window and
hybrid layers, fp8 cache), and llama.cpp's KV buffer for a context. Called by `engines.py`.
"""

from __future__ import annotations

from fractions import Fraction

from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.quant import ggml_type_bytes
from cohabit.estimate.shape import LINEAR, SLIDING, ModelShape

KV_DTYPE_BYTES = {"auto": 0, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float16": 2, "bfloat16": 2}
LLAMACPP_CTX_PADDING = 256
# The recurrent (SSM / delta-rule) state is counted in float32: vLLM's mamba_ssm_cache_dtype
# follows the model dtype by default but several models force float32, and llama.cpp keeps it
# in f32; the larger never leaves the budget short. The conv window uses the model dtype.
SSM_STATE_BYTES = 4
VLLM_KERNEL_BLOCK_ALIGNMENT = 16


def kv_dtype_bytes(kv_cache_dtype: str, act_bytes: int) -> int:
    """Bytes per cached element: `auto` follows the model's activation dtype, fp8 is 1."""
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise InvalidSetting(
            f"unknown kv cache dtype {kv_cache_dtype!r} (use {', '.join(KV_DTYPE_BYTES)})"
        )
    return KV_DTYPE_BYTES[kv_cache_dtype] or act_bytes


def kv_heads_per_rank(shape: ModelShape, tensor_parallel: int) -> int:
    """KV heads one rank caches: kv_heads / tp, but at least 1 — with fewer KV heads than ranks
    vLLM replicates them (Llama-3-70B, 8 KV heads, tp 16: one head per rank, not half)."""
    return max(1, shape.num_kv_heads // tensor_parallel)


def kv_bytes_per_token(
    shape: ModelShape, *, dtype_bytes: int, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> int:
    """KV bytes one token costs on one GPU, over the layers of the busiest pipeline stage.

    GQA/MHA: 2 × layers × kv_heads_per_rank × head_dim × dtype_bytes — Llama-3.1-8B in bf16:
    2 × 32 × 8 × 128 × 2 = 131,072 bytes; with `--kv-cache-dtype fp8`, 65,536.
    MLA (DeepSeek-V2/V3): layers × (kv_lora_rank + qk_rope_head_dim) × dtype_bytes, the same on
    every rank — DeepSeek-V3: 61 × (512 + 64) × 2 = 70,272 bytes.
    Sliding-window layers count like full ones (vLLM reports tokens over all attention layers);
    linear-attention / mamba layers keep no per-token cache.
    """
    layers = shape.attention_layers
    if pipeline_parallel > 1:
        layers = -(-layers // pipeline_parallel)
    if shape.mla is not None:
        return layers * (shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim) * dtype_bytes
    return 2 * layers * kv_heads_per_rank(shape, tensor_parallel) * shape.head_dim * dtype_bytes


def kv_bytes_for_tokens(per_token_bytes: int, tokens: int, *, block_size: int = 16) -> int:
    """vLLM allocates whole blocks: ceil(tokens / 16) × 16 × per-token bytes.

    Llama-3.1-8B, one 16,000-token sequence: 1,000 blocks × 16 × 131,072 = 2,097,152,000 bytes.
    """
    blocks = -(-tokens // block_size)
    return blocks * block_size * per_token_bytes


def llamacpp_kv_bytes(
    shape: ModelShape,
    *,
    n_ctx: int,
    n_layers: int | None = None,
    type_k: str = "f16",
    type_v: str = "f16",
    n_seq: int = 1,
    n_ubatch: int = 512,
    swa_full: bool = False,
) -> int:
    """llama.cpp's KV buffer: n_ctx × layers × (n_embd_k_gqa × k bytes + n_embd_v_gqa × v bytes).

    n_ctx is padded to 256. Llama-3-8B at n_ctx 512 in f16: 512 × 32 × (1,024 + 1,024) × 2 =
    64 MiB, as llama.cpp prints. Sliding-window layers keep only min(n_ctx, window × n_seq +
    n_ubatch) cells unless `swa_full`. `n_layers` limits the count to offloaded layers.
    """
    if n_ctx <= 0:
        raise InvalidSetting(f"context size must be positive, got {n_ctx}")
    ctx = -(-n_ctx // LLAMACPP_CTX_PADDING) * LLAMACPP_CTX_PADDING
    if shape.mla is not None:
        k_width = shape.mla.kv_lora_rank + shape.mla.qk_rope_head_dim
        v_width = shape.mla.kv_lora_rank
    else:
        k_width = v_width = shape.num_kv_heads * shape.head_dim
    per_cell = ggml_type_bytes(type_k) * k_width + ggml_type_bytes(type_v) * v_width
    kinds = shape.kinds[: shape.num_layers if n_layers is None else n_layers]
    total = Fraction(0)
    # recurrent layers keep one f32 state per sequence (llama.cpp's r_l / s_l buffers)
    recurrent = 0
    if shape.linear_state is not None:
        state = shape.linear_state.conv_elements + shape.linear_state.ssm_elements
        recurrent = 4 * state * n_seq
    for kind in kinds:
        if kind == LINEAR:
            total += recurrent
            continue
        cells = ctx
        if kind == SLIDING and shape.sliding_window and not swa_full:
            swa = shape.sliding_window * n_seq + n_ubatch
            cells = min(ctx, -(-swa // LLAMACPP_CTX_PADDING) * LLAMACPP_CTX_PADDING)
        total += per_cell * cells
    return int(total)


def linear_state_bytes(shape: ModelShape, *, act_bytes: int, tensor_parallel: int = 1) -> int:
    """One sequence's state in one linear-attention / Mamba layer on one rank: conv window
    (model dtype) + recurrent state (float32), both split with the heads over tp ranks.

    Qwen3-Next-80B-A3B, tp 1: 24,576 × 2 + 524,288 × 4 = 2,146,304 bytes per layer.
    """
    state = shape.linear_state
    if state is None or shape.linear_layers == 0:
        return 0
    tp = tensor_parallel
    return (state.conv_elements // tp) * act_bytes + (state.ssm_elements // tp) * SSM_STATE_BYTES


def vllm_sequence_kv_bytes(
    shape: ModelShape,
    *,
    per_token_bytes: int,
    tokens: int,
    act_bytes: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """KV-cache bytes vLLM needs on one GPU for one sequence of `tokens` tokens.

    Attention-only models: whole 16-token blocks (`kv_bytes_for_tokens`). Hybrid models
    (Qwen3-Next, Jamba, Granite-4) also keep one state per linear layer and sequence; V1 makes
    every layer's page the same size, so it grows the attention block to the multiple of 16
    tokens whose page holds a state, and pads each state to that page. Qwen3-Next-80B-A3B, tp 1:
    attention pages of 2,048 bytes per token and layer, state 2,146,304 bytes → blocks of
    16 × ceil(2,146,304 / (16 × 2,048)) = 1,056 tokens; 36 linear layers × 1,056 × 2,048 =
    77.9 MB per sequence besides the 12 attention layers' KV.
    """
    state = linear_state_bytes(shape, act_bytes=act_bytes, tensor_parallel=tensor_parallel)
    if state == 0:
        return kv_bytes_for_tokens(per_token_bytes, tokens)
    linear = -(-shape.linear_layers // pipeline_parallel)
    attention = -(-shape.attention_layers // pipeline_parallel)
    per_layer_token = per_token_bytes // attention if attention else 0
    if per_layer_token == 0:
        return linear * state
    align = VLLM_KERNEL_BLOCK_ALIGNMENT
    block = align * -(-state // (align * per_layer_token))
    return kv_bytes_for_tokens(per_token_bytes, tokens, block_size=block) + (
        linear * block * per_layer_token
    )
