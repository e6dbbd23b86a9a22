"""What each engine holds besides weights and KV: vLLM's profiled activation peak (as its V0
or V1 profile run makes it, vision towers included), non-torch memory, CUDA graphs and CUDA
context; llama.cpp's compute buffer and backend overhead; MLX's prefill scratch. `estimate.py`
adds these to the weight and KV bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.shape import ModelShape
from cohabit.units import GIB, MIB

# --- vLLM -------------------------------------------------------------------------------------
# Two engines with different profile runs: V0 (vLLM ≤ 0.7, and 0.8–0.9 where it was still
# selectable) and V1 (the default from 0.8, the only one from 0.10).
VLLM_V0, VLLM_V1 = "v0", "v1"
_FIRST_V1_RELEASE = (0, 8)
_VERSION_RE = re.compile(r"(\d+)\.(\d+)")
# "V0", "(V1 engine)" — but not the "v0" of "v0.11.0"
_ENGINE_MARK_RE = re.compile(r"\bv([01])\b(?!\.\d)", re.IGNORECASE)
VLLM_BLOCK_SIZE = 16
VLLM_LARGE_GPU_BYTES = 70 * GIB
# Scheduler defaults of `vllm serve` (engine/arg_utils.py): GPUs of 70 GiB or more that are not
# A100s get 8192 batched tokens and 1024 sequences, the rest 2048 and 256.
VLLM_LARGE_DEFAULTS = (8192, 1024)
VLLM_SMALL_DEFAULTS = (2048, 256)
# V0 (engine/arg_utils.py, config.py): 256 sequences on any GPU; without chunked prefill a
# prefill batch must hold a whole prompt, so max(max_model_len, 2048) tokens; chunked prefill
# turned itself on for text models longer than 32K, with a 2048-token budget (512 before 0.6.4;
# the larger is kept, it only over-reserves).
VLLM_V0_MAX_NUM_SEQS = 256
VLLM_V0_MIN_BATCHED_TOKENS = 2048
VLLM_V0_LONG_CONTEXT = 32 * 1024
# Bytes per (request × vocab) logit in the profile run's sampler pass. vLLM samples with
# temperature 0.5, top-k = vocab − 1 and top-p 0.9, which takes the sort-based path: bf16 logits
# (2) + fp32 copy (4) + sorted values (4) + int64 sort indices (8) + radix-sort scratch for
# both (12) + scattered logits (4) + probs (4) + exponential noise (4) = 42 allocated, about 40
# live at the peak.
VLLM_SAMPLER_BYTES_PER_LOGIT = 40
VLLM_FUSED_MOE_CHUNK_TOKENS = 32768
# "non-torch" memory the profiler sees: cuBLAS/cuDNN workspaces and allocator slack on one GPU;
# with tp > 1 NCCL communicators and custom all-reduce IPC buffers, growing with the ranks.
VLLM_NON_TORCH_BYTES = 160 * MIB
VLLM_NON_TORCH_TP_BASE_BYTES = 400 * MIB
VLLM_NON_TORCH_PER_RANK_BYTES = 64 * MIB
VLLM_MAX_CAPTURE_SIZE = 512
CUDA_GRAPH_BYTES_PER_SIZE = 2 * MIB
# The CUDA context (and lazily loaded kernels) exists before vLLM's baseline snapshot, so it is
# outside gpu_memory_utilization's accounting but on the card all the same.
CUDA_CONTEXT_BYTES = 512 * MIB

# --- llama.cpp --------------------------------------------------------------------------------
LLAMACPP_UBATCH = 512
LLAMACPP_BACKEND_BYTES = 256 * MIB  # CUDA/Metal context and cuBLAS workspace, not printed

# --- MLX (Apple silicon) ----------------------------------------------------------------------
MLX_PREFILL_STEP = 2048  # mlx-lm's prefill_step_size
MLX_KV_STEP = 256  # mlx-lm grows its KV cache in steps of 256 tokens
MLX_RUNTIME_BYTES = 256 * MIB


def vllm_generation(engine_version: str | None) -> str:
    """Which vLLM engine a version string means: "v0" or "v1" (None: today's V1).

    Accepts what logs and records carry: "0.6.4", "v0.11.0", "~0.8.x (V0 log format)",
    "0.19.0 (V1)", or just "V0" / "V1". An explicit V0 / V1 mark wins; otherwise releases
    before 0.8 are V0. Raises InvalidSetting for text with neither.
    """
    if engine_version is None or not engine_version.strip():
        return VLLM_V1
    text = engine_version.strip()
    mark = _ENGINE_MARK_RE.search(text)
    if mark:
        return VLLM_V0 if mark.group(1) == "0" else VLLM_V1
    version = _VERSION_RE.search(text)
    if version is None:
        raise InvalidSetting(
            f"engine version {engine_version!r} is neither a release such as 0.11.0 nor V0/V1"
        )
    release = (int(version.group(1)), int(version.group(2)))
    return VLLM_V0 if release < _FIRST_V1_RELEASE else VLLM_V1


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmScheduler:
    """The scheduler limits that size vLLM's profile run, and the engine that runs it."""

    max_num_batched_tokens: int
    max_num_seqs: int
    generation: str = VLLM_V1


def vllm_scheduler(
    *,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    device_total_bytes: int | None,
    device_name: str | None,
    generation: str = VLLM_V1,
    max_model_len: int | None = None,
    multimodal: bool = False,
) -> tuple[VllmScheduler, bool]:
    """Settings vLLM will use, and whether any came from its defaults.

    V1 defaults depend on the GPU (70 GiB or more and not an A100: 8192 tokens, 1024
    sequences; otherwise 2048 and 256). With no device given we assume the large ones: a
    larger profile run only over-reserves, the smaller would let the engine run out after
    placement. V0: 256 sequences; max(max_model_len, 2048) tokens, or 2048 when it turned on
    chunked prefill by itself (text models longer than 32K tokens).
    """
    if generation == VLLM_V0:
        length = max_model_len or VLLM_V0_MIN_BATCHED_TOKENS
        chunked = length > VLLM_V0_LONG_CONTEXT and not multimodal
        tokens_default = (
            VLLM_V0_MIN_BATCHED_TOKENS if chunked else max(length, VLLM_V0_MIN_BATCHED_TOKENS)
        )
        seqs_default = VLLM_V0_MAX_NUM_SEQS
    else:
        # vLLM tests the name and the memory; an unknown one counts as large (never short)
        big = device_total_bytes is None or device_total_bytes >= VLLM_LARGE_GPU_BYTES
        large = big and "a100" not in (device_name or "").lower()
        tokens_default, seqs_default = VLLM_LARGE_DEFAULTS if large else VLLM_SMALL_DEFAULTS
    tokens = max_num_batched_tokens or tokens_default
    seqs = min(max_num_seqs or seqs_default, tokens)
    used_default = max_num_batched_tokens is None or max_num_seqs is None
    scheduler = VllmScheduler(
        max_num_batched_tokens=tokens, max_num_seqs=seqs, generation=generation
    )
    return scheduler, used_default


def forward_activation_bytes(
    shape: ModelShape, *, tokens: int, act_bytes: int, tensor_parallel: int = 1
) -> int:
    """Peak of one decoder layer's forward pass over `tokens` tokens on one rank.

    The MLP is the peak: the residual stream, the normed input and the caller's reference
    (3 × hidden) plus gate_up (2 × I / tp) and the activation output (I / tp). Llama-3.1-8B,
    29,000 tokens: 29,000 × (3 × 4,096 + 3 × 14,336) × 2 = 3.21 GB = 2.99 GiB — vLLM measured
    2.99 GiB (and 2.07 at 20,000 tokens, where this gives 2.06). MoE layers use the fused-MoE
    caches: top_k × (3 × I_expert / tp + hidden) per token, in chunks of 32,768 tokens.
    """
    tp = tensor_parallel
    h = shape.hidden_size
    dense = 3 * h + 3 * shape.intermediate_size // tp
    attn_width = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim // tp
    attention = 3 * h + attn_width + shape.num_heads * shape.head_dim // tp
    per_token = max(dense, attention)
    if shape.mla is not None:
        m = shape.mla
        per_head = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
        per_token = max(per_token, 3 * h + 2 * shape.num_heads * per_head // tp)
    peak = tokens * per_token * act_bytes
    moe = shape.moe
    if moe is not None:
        chunk = min(tokens, VLLM_FUSED_MOE_CHUNK_TOKENS)
        width = moe.expert_intermediate_size // tp
        shared = 3 * moe.shared_intermediate_size // tp
        moe_per_token = moe.experts_per_token * (3 * width + h) + shared
        moe_peak = (tokens * 3 * h + chunk * moe_per_token) * act_bytes
        moe_peak += chunk * moe.num_experts * 4  # fp32 router logits
        # All-MoE models never run the dense MLP; mixed ones (DeepSeek's first layers) do.
        peak = moe_peak if moe.dense_layers == 0 else max(peak, moe_peak)
    return peak


def vllm_profile_images(shape: ModelShape, *, scheduler: VllmScheduler) -> int:
    """How many dummy images vLLM's profile run pushes through the vision tower at once.

    V1 (`gpu_model_runner.profile_run`): the encoder budget is max(max_num_batched_tokens, one
    image's tokens); it runs ceil(budget ÷ tokens per image) images, at most max_num_seqs.
    V0 decoder-only models (`model_runner.profile_run`): max_num_seqs is cut to
    max_num_batched_tokens ÷ tokens per image sequences, one image each. V0 encoder-decoder
    models (`enc_dec_model_runner.profile_run`, mllama) do not cut it: every one of the
    max_num_seqs dummy sequences carries an image — Llama-3.2-11B-Vision with
    --max-num-seqs 128 profiles 128 images of 4 tiles.
    """
    v = shape.vision
    if v is None:
        return 0
    per_image = v.llm_tokens_per_image
    tokens, seqs = scheduler.max_num_batched_tokens, scheduler.max_num_seqs
    if scheduler.generation == VLLM_V0:
        if v.encoder_decoder:
            return seqs
        return max(1, min(seqs, tokens // per_image))
    budget = max(tokens, per_image)
    return max(1, min(seqs, -(-budget // per_image)))


def vision_image_bytes(shape: ModelShape, *, act_bytes: int) -> int:
    """Peak bytes one image holds inside the vision tower, at its last layers.

    Per tower token: the residual stream and normed input (2 × vision hidden), the MLP's
    fc1 output and activation (2 × MLP width), and the outputs of the intermediate layers
    the model keeps for its projector. mllama also holds its tile mask, tokens² in the
    model dtype, for the whole tower. Llama-3.2-11B-Vision: 6,432 tokens × (2 × 1,280 +
    2 × 5,120 + 5 × 1,280) × 2 + 6,432² × 2 = 247 MB + 83 MB = 330 MB per image.
    """
    v = shape.vision
    if v is None:
        return 0
    tokens = v.tower_tokens_per_image
    width = (2 + v.intermediate_layers) * v.hidden_size + 2 * v.intermediate_size
    peak = tokens * width * act_bytes
    if v.dense_tile_mask:
        peak += tokens * tokens * act_bytes
    return peak


def vision_activation_bytes(
    shape: ModelShape, *, scheduler: VllmScheduler, act_bytes: int, tensor_parallel: int = 1
) -> int:
    """The vision part of vLLM's profile run: `vllm_profile_images` images through the tower
    together, then (encoder-decoder models) the decoder's cross-attention over their
    embeddings: the projected states (hidden) plus one layer's K and V of them, on top of
    the decoder's own forward pass.

    Llama-3.2-11B-Vision, V0, 128 sequences: 128 × 330 MB = 39.3 GiB in the tower (vLLM
    measured a 36.63 GiB activation peak); cross-attention 128 × 6,404 × (4,096 + 2,048) × 2
    = 10.1 GB, less.
    """
    v = shape.vision
    if v is None:
        return 0
    images = vllm_profile_images(shape, scheduler=scheduler)
    tower = images * vision_image_bytes(shape, act_bytes=act_bytes)
    if not v.encoder_decoder:
        return tower
    kv_width = 2 * max(1, shape.num_kv_heads // tensor_parallel) * shape.head_dim
    states = images * v.llm_tokens_per_image * (shape.hidden_size + kv_width) * act_bytes
    decoder = forward_activation_bytes(
        shape,
        tokens=scheduler.max_num_batched_tokens,
        act_bytes=act_bytes,
        tensor_parallel=tensor_parallel,
    )
    return max(tower, states + decoder)


def vllm_activation_bytes(
    shape: ModelShape, *, scheduler: VllmScheduler, act_bytes: int, tensor_parallel: int = 1
) -> int:
    """vLLM's "torch peak memory increase": the largest of the dummy forward pass over
    max_num_batched_tokens, the sampler pass over min(max_num_seqs, tokens) requests (logits of
    the full vocabulary on every rank, with the forward's hidden states still held), and the
    vision pass (`vision_activation_bytes`). V1 keeps the dummy images' embeddings in its
    encoder cache during the forward and sampler passes; V0 computes them inside the forward.

    Llama-3.1-8B on an H100 with `vllm serve` defaults (8192 tokens, 1024 sequences): sampler
    1,024 × 128,256 × 40 = 4.89 GiB + hidden states 64 MiB; forward 0.84 GiB. vLLM measured
    4.76 GiB. Qwen3-0.6B (vocab 151,936): 5.81 GiB vs 5.56 measured. V0 samples the same
    way (top-k = vocab − 1, top-p 0.99) for max_num_seqs = 256 sequences.
    """
    tokens = scheduler.max_num_batched_tokens
    forward = forward_activation_bytes(
        shape, tokens=tokens, act_bytes=act_bytes, tensor_parallel=tensor_parallel
    )
    vocab = -(-shape.vocab_size // 64) * 64
    sampler = scheduler.max_num_seqs * vocab * VLLM_SAMPLER_BYTES_PER_LOGIT
    sampler += tokens * shape.hidden_size * act_bytes
    vision = vision_activation_bytes(
        shape, scheduler=scheduler, act_bytes=act_bytes, tensor_parallel=tensor_parallel
    )
    v = shape.vision
    if v is not None and scheduler.generation == VLLM_V1:
        images = vllm_profile_images(shape, scheduler=scheduler)
        cached = images * v.llm_tokens_per_image * shape.hidden_size * act_bytes
        forward += cached
        sampler += cached
    return max(forward, sampler, vision)


def vllm_non_torch_bytes(tensor_parallel: int) -> int:
    """Non-torch memory per GPU: 160 MiB alone (vLLM logs 0.13–0.14 GiB on an H100); with
    tp > 1, + 400 MiB of NCCL / custom all-reduce buffers + 64 MiB per rank (logged: 0.55 GiB
    at tp 2, 0.93 at tp 8; this gives 0.67 and 1.05)."""
    if tensor_parallel <= 1:
        return VLLM_NON_TORCH_BYTES
    return (
        VLLM_NON_TORCH_BYTES
        + VLLM_NON_TORCH_TP_BASE_BYTES
        + VLLM_NON_TORCH_PER_RANK_BYTES * tensor_parallel
    )


def vllm_capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Batch sizes vLLM captures CUDA graphs for: 1, 2, 4, then every 8 to 248, then every 16,
    up to min(2 × max_num_seqs, 512)."""
    top = min(2 * max_num_seqs, VLLM_MAX_CAPTURE_SIZE)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
    return tuple(s for s in sizes if s <= top)


def vllm_cuda_graph_bytes(
    shape: ModelShape,
    *,
    scheduler: VllmScheduler,
    act_bytes: int,
    tensor_parallel: int = 1,
    enforce_eager: bool = False,
) -> int:
    """CUDA-graph memory: the graph pool (one forward at the largest captured batch) plus
    ~2 MiB of graph state per captured size; zero with enforce_eager. Llama-3.1-8B at 1024
    sequences: 51 sizes → 102 MiB + a 54 MiB pool = 156 MiB."""
    if enforce_eager:
        return 0
    sizes = vllm_capture_sizes(scheduler.max_num_seqs)
    pool = forward_activation_bytes(
        shape, tokens=max(sizes), act_bytes=act_bytes, tensor_parallel=tensor_parallel
    )
    return pool + len(sizes) * CUDA_GRAPH_BYTES_PER_SIZE


def llamacpp_compute_bytes(
    shape: ModelShape,
    *,
    n_ctx: int,
    n_ubatch: int = LLAMACPP_UBATCH,
    flash_attn: bool = False,
    output_on_gpu: bool = True,
) -> int:
    """llama.cpp's GPU compute buffer, its worst-case graph reservation for one ubatch: the
    largest of the fp32 logits (n_ubatch × vocab × 4, when the output layer is offloaded), the
    attention scores without flash attention (n_ubatch × n_ctx × heads × 4) and the MLP
    (n_ubatch × 2 × I × 4), plus three hidden-sized fp32 buffers.

    Llama-3-8B, n_ctx 512: 512 × 128,256 × 4 = 250.5 MiB + 24 MiB = 274.5 MiB; llama.cpp
    printed 258.5 MiB.
    """
    ctx = -(-n_ctx // 256) * 256
    logits = n_ubatch * shape.vocab_size * 4 if output_on_gpu else 0
    scores = 0 if flash_attn else n_ubatch * ctx * shape.num_heads * 4
    width = shape.intermediate_size
    if shape.moe is not None:
        width = max(width, shape.moe.experts_per_token * shape.moe.expert_intermediate_size)
    mlp = n_ubatch * 2 * width * 4
    return max(logits, scores, mlp) + 3 * n_ubatch * shape.hidden_size * 4


def mlx_activation_bytes(shape: ModelShape, *, act_bytes: int, concurrency: int = 1) -> int:
    """mlx-lm prefills in steps of 2,048 tokens and computes logits for the last one only:
    one forward at 2,048 tokens plus fp32 logits per sequence."""
    forward = forward_activation_bytes(shape, tokens=MLX_PREFILL_STEP, act_bytes=act_bytes)
    return forward + concurrency * shape.vocab_size * 4
