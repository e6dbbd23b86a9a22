"""Weight bytes per GPU: from the architecture and the quantization scheme (params per layer,
embeddings, lm_head unless tied), or exactly from safetensors / GGUF tensor bytes, split across
tensor- and pipeline-parallel ranks the way vLLM shards them. `estimate.py` and `engines.py`
call `weight_layout()` and `weights_per_gpu()`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from cohabit.estimate.quant import ggml_type_bytes, gguf_tensor_type, linear_weight_bytes
from cohabit.estimate.shape import ModelShape, QuantSpec, TensorInfo

VOCAB_PADDING = 64  # vLLM pads embedding and lm_head rows to a multiple of 64
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks|blk|layer)\.(\d+)\.")
_FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightLayout:
    """Weight bytes of one tensor-parallel rank, by where they live.

    `layer_bytes` has one entry per decoder layer (what llama.cpp offloads with n_gpu_layers and
    what pipeline stages split); `embed_bytes` is the token embedding, `head_bytes` the lm_head
    plus final norm, `other_bytes` the vision tower and anything outside the decoder.
    `total_bytes` is the whole model on one device (tp = 1), as stored by the runtime.
    """

    embed_bytes: int
    head_bytes: int
    layer_bytes: tuple[int, ...]
    other_bytes: int
    total_bytes: int

    @property
    def per_rank_bytes(self) -> int:
        return self.embed_bytes + self.head_bytes + sum(self.layer_bytes) + self.other_bytes


@dataclass(frozen=True, slots=True)
class _Params:
    role: str  # attn_q attn_kv attn_v attn_o ffn ffn_down experts experts_down router norm ...
    group: str  # attn | mlp | experts | shared | router | norm | bias | vision
    total: int
    per_rank: int


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _layer_params(shape: ModelShape, layer: int, tp: int, quant: QuantSpec) -> list[_Params]:
    h = shape.hidden_size
    out: list[_Params] = [_Params("norm", "norm", 2 * h, 2 * h)]
    if shape.mla is not None:
        m = shape.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        nh = shape.num_heads
        if m.q_lora_rank:
            out.append(_Params("attn_q", "attn", h * m.q_lora_rank, h * m.q_lora_rank))
            out.append(_Params("norm", "norm", m.q_lora_rank, m.q_lora_rank))
            q_b = m.q_lora_rank * nh * qk
            out.append(_Params("attn_q", "attn", q_b, q_b // tp))
        else:
            out.append(_Params("attn_q", "attn", h * nh * qk, h * nh * qk // tp))
        kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        out.append(_Params("attn_kv", "attn", kv_a, kv_a))
        out.append(_Params("norm", "norm", m.kv_lora_rank, m.kv_lora_rank))
        kv_b = m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim)
        out.append(_Params("attn_v", "attn", kv_b, kv_b // tp))
        o = nh * m.v_head_dim * h
        out.append(_Params("attn_o", "attn", o, o // tp))
    else:
        d = shape.head_dim
        q = h * shape.num_heads * d
        kv = h * shape.num_kv_heads * d
        kv_rank = h * max(1, shape.num_kv_heads // tp) * d
        out += [
            _Params("attn_q", "attn", q, q // tp),
            _Params("attn_kv", "attn", kv, kv_rank),
            _Params("attn_v", "attn", kv, kv_rank),
            _Params("attn_o", "attn", q, q // tp),
        ]
        if shape.qkv_bias:
            qb = (shape.num_heads + 2 * shape.num_kv_heads) * d
            out.append(_Params("bias", "bias", qb, qb // tp))
        if shape.o_bias:
            out.append(_Params("bias", "bias", h, h))
    moe = shape.moe
    if moe is not None and layer >= moe.dense_layers:
        e = moe.num_experts
        width = moe.expert_intermediate_size
        up_mats = 2 if shape.gated_mlp else 1
        rank_width, rank_h = width // tp, h
        if quant.method == "mxfp4":
            # vLLM's mxfp4 MoE kernels pad the per-rank width to 128 and hidden to 256.
            rank_width, rank_h = _round_up(width // tp, 128), _round_up(h, 256)
        out.append(
            _Params(
                "experts", "experts", e * up_mats * h * width, e * up_mats * rank_h * rank_width
            )
        )
        out.append(_Params("experts_down", "experts", e * h * width, e * rank_h * rank_width))
        if moe.expert_bias:
            out.append(_Params("bias", "bias", e * (2 * width + h), e * (2 * rank_width + rank_h)))
        router = h * e + (e if moe.expert_bias else 0)
        out.append(_Params("router", "router", router, router))
        if moe.shared_intermediate_size:
            s = moe.shared_intermediate_size
            out.append(_Params("ffn", "shared", 2 * h * s, 2 * h * s // tp))
            out.append(_Params("ffn_down", "shared", h * s, h * s // tp))
    else:
        width = shape.intermediate_size
        up = (2 if shape.gated_mlp else 1) * h * width
        out.append(_Params("ffn", "mlp", up, up // tp))
        out.append(_Params("ffn_down", "mlp", h * width, h * width // tp))
        if shape.mlp_bias:
            out.append(_Params("bias", "bias", 2 * width + h, (2 * width) // tp + h))
    return out


def _vision_params(shape: ModelShape) -> int:
    v = shape.vision
    if v is None:
        return 0
    vh, vi = v.hidden_size, v.intermediate_size
    per_layer = 4 * vh * vh + 2 * vh * vi + 9 * vh
    patch_embed = 3 * v.patch_size * v.patch_size * vh
    merged = vh * v.spatial_merge_size * v.spatial_merge_size
    projector = merged * shape.hidden_size + shape.hidden_size * shape.hidden_size
    return v.num_layers * per_layer + patch_embed + projector


_SKIP_LAYER_RE = re.compile(r"layers\.(\d+|\*)\.")


def _skipped(quant: QuantSpec, group: str, layer: int) -> bool:
    """Whether `modules_to_not_convert` keeps this group of this layer unquantized: entries
    such as "model.layers.*.self_attn", "model.layers.0.mlp" or just "self_attn"."""
    for module in quant.modules_to_not_convert:
        text = module.lower()
        match = _SKIP_LAYER_RE.search(text)
        if match and match.group(1) != "*" and int(match.group(1)) != layer:
            continue
        if group == "attn" and "attn" in text:
            return True
        if group == "shared" and "shared_expert" in text:
            return True
        if group in ("mlp", "shared", "experts") and (
            text.endswith(".mlp") or text == "mlp" or text.endswith(".experts")
        ):
            return True
    return False


def _hf_bytes_per_param(quant: QuantSpec, group: str, layer: int, act_bytes: int) -> Fraction:
    if group in ("norm", "bias", "router", "vision"):
        return Fraction(act_bytes)
    if not quant.is_quantized or _skipped(quant, group, layer):
        return Fraction(act_bytes)
    if quant.method == "mxfp4" and group != "experts":
        return Fraction(act_bytes)
    return linear_weight_bytes(quant, act_bytes)


def _gguf_role(role: str) -> str:
    if role in ("attn_v", "norm"):
        return role
    if role in ("ffn_down", "experts_down"):
        return "ffn_down"
    return "other"


def weight_layout(
    shape: ModelShape, *, act_bytes: int, quant: QuantSpec, tensor_parallel: int = 1
) -> WeightLayout:
    """Weight bytes per rank, derived from the architecture.

    Worked example, meta-llama/Llama-3.1-8B-Instruct in bf16, tp = 1: embeddings 128,256 ×
    4,096 = 525 M params, lm_head the same (untied), 32 layers × 218 M (q 16.8 M, k and v
    4.2 M each, o 16.8 M, MLP 3 × 4,096 × 14,336 = 176 M) = 6.98 G: 8.03 G params × 2 bytes =
    16,060,522,496 bytes = 14.96 GiB; vLLM prints "Model loading took 14.99 GiB".
    With tp = 2 every matrix is split in two except norms and the 8 KV heads stay 4 per rank.

    GGUF file types (`quant.method == "gguf"`) use llama.cpp's per-tensor type mix.
    """
    tp = tensor_parallel
    gguf_type = quant.gguf_type if quant.method == "gguf" else None
    n = shape.num_layers

    def price(p: _Params, layer: int) -> tuple[Fraction, Fraction]:
        if gguf_type is not None:
            per = ggml_type_bytes(gguf_tensor_type(gguf_type, _gguf_role(p.role), layer, n))
        else:
            per = _hf_bytes_per_param(quant, p.group, layer, act_bytes)
        return per * p.total, per * p.per_rank

    layer_bytes: list[int] = []
    total = Fraction(0)
    for layer in range(n):
        rank = Fraction(0)
        for p in _layer_params(shape, layer, tp, quant):
            t, r = price(p, layer)
            total += t
            rank += r
        layer_bytes.append(int(rank))

    vocab_rows = _round_up(shape.vocab_size, VOCAB_PADDING)
    embed_params = shape.vocab_size * shape.hidden_size
    if gguf_type is not None:
        embed_per = ggml_type_bytes(gguf_tensor_type(gguf_type, "token_embd", 0, n))
        head_per = ggml_type_bytes(gguf_tensor_type(gguf_type, "output", n - 1, n))
        if shape.tie_word_embeddings:
            head_per = Fraction(0)
        embed_rank = embed_per * embed_params
        head_rank = head_per * embed_params
    else:
        embed_per = head_per = Fraction(act_bytes)
        if shape.tie_word_embeddings:
            head_per = Fraction(0)
        embed_rank = embed_per * vocab_rows * shape.hidden_size / tp
        head_rank = head_per * vocab_rows * shape.hidden_size / tp
    total += (embed_per + head_per) * embed_params
    norm = act_bytes * shape.hidden_size
    vision = _vision_params(shape) * act_bytes
    total += norm + vision
    return WeightLayout(
        embed_bytes=int(embed_rank),
        head_bytes=int(head_rank) + norm,
        layer_bytes=tuple(layer_bytes),
        other_bytes=vision // tp,
        total_bytes=int(total),
    )


def layout_from_gguf(shape: ModelShape, tensors: tuple[TensorInfo, ...]) -> WeightLayout:
    """Exact GGUF bytes by place: token_embd, output (+ output_norm), blk.N.*, the rest.

    llama.cpp keeps token_embd on the host and offloads blk.N for N < n_gpu_layers, plus the
    output layer when n_gpu_layers > n_layer (llama.cpp prints 33/33 for a 32-layer model).
    """
    layers = [0] * shape.num_layers
    embed = head = other = 0
    for tensor in tensors:
        name = tensor.name
        if name.startswith("token_embd."):
            embed += tensor.nbytes
        elif name.startswith("output"):
            head += tensor.nbytes
        else:
            match = _LAYER_RE.search("." + name)
            index = int(match.group(1)) if match else -1
            if 0 <= index < shape.num_layers:
                layers[index] += tensor.nbytes
            else:
                other += tensor.nbytes
    total = embed + head + sum(layers) + other
    return WeightLayout(
        embed_bytes=embed,
        head_bytes=head,
        layer_bytes=tuple(layers),
        other_bytes=other,
        total_bytes=total,
    )


def checkpoint_runtime_bytes(
    shape: ModelShape, tensors: tuple[TensorInfo, ...], *, act_bytes: int, cast_floats: bool
) -> int:
    """Exact bytes the engine holds for checkpoint tensors: 16/32-bit weights and biases are
    cast to the activation dtype (an fp32 checkpoint served in bf16 halves), quantized
    payloads and their scales stay as stored; layers past `num_hidden_layers` (DeepSeek-V3's
    multi-token-prediction layer) are not loaded."""
    total = 0
    for tensor in tensors:
        match = _LAYER_RE.search("." + tensor.name)
        if match and int(match.group(1)) >= shape.num_layers and "vision" not in tensor.name:
            continue
        is_weight = tensor.name.endswith((".weight", ".bias")) and "scale" not in tensor.name
        if cast_floats and tensor.dtype in _FLOAT_DTYPES and is_weight:
            total += tensor.numel * act_bytes
        else:
            total += tensor.nbytes
    return total


def weights_per_gpu(layout: WeightLayout, *, pipeline_parallel: int = 1) -> int:
    """Bytes on the busiest GPU: with pipeline parallelism the first stage holds the
    embeddings, the last the lm_head, and each ceil(layers / pp) layers."""
    if pipeline_parallel <= 1:
        return layout.per_rank_bytes
    per_stage = -(-len(layout.layer_bytes) // pipeline_parallel)
    stages = [
        sum(layout.layer_bytes[i : i + per_stage])
        for i in range(0, len(layout.layer_bytes), per_stage)
    ]
    first = stages[0] + layout.embed_bytes + layout.other_bytes
    last = stages[-1] + layout.head_bytes
    return max(first, last, *stages)
