"""ModelShape: the few numbers of a model that the memory formulas need, read from a Hugging Face
`config.json` (dense, GQA, MoE, MLA, sliding-window and hybrid layers, vision towers,
`quantization_config`). `checkpoint.py` adds exact tensor bytes from safetensors and GGUF files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cohabit.estimate.errors import UnsupportedModel
from cohabit.estimate.limits import MAX_DIMENSION, MAX_LAYERS, opt_int, ratio, whole_number
from cohabit.estimate.recurrent import LinearStateShape, linear_state_from_config

LayerKind = str  # "full" | "sliding" | "linear" (no per-token KV: mamba, linear attention)
FULL, SLIDING, LINEAR = "full", "sliding", "linear"

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
}

# Architectures whose MLP is fc1 → act → fc2 (two matrices) instead of gate/up/down (three).
_NON_GATED_TYPES = frozenset(
    {
        "gpt2",
        "gpt_neox",
        "gptj",
        "opt",
        "bloom",
        "falcon",
        "phi",
        "gpt_bigcode",
        "starcoder2",
        "mpt",
    }
)
# Qwen2-family attention carries a bias on q, k and v that the config does not declare.
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"})
# Families whose config class ties embeddings when config.json leaves the key out.
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})
_ROPE_TYPES_WITHOUT_LENGTH_SCALING = frozenset({"su", "longrope", "llama3", "mrope", "default"})
_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantSpec:
    """How a checkpoint stores its linear weights.

    `method` is one of none, awq, gptq, fp8, bitsandbytes, mxfp4, gguf. `bits` and `group_size`
    describe integer schemes (group_size 0 = one scale per output channel); `gguf_type` names a
    llama.cpp file type such as Q4_K_M. Modules named in `modules_to_not_convert` stay 16-bit.
    """

    method: str = "none"
    bits: int = 16
    group_size: int = 0
    modules_to_not_convert: tuple[str, ...] = ()
    gguf_type: str | None = None

    @property
    def is_quantized(self) -> bool:
        return self.method != "none"


NO_QUANT = QuantSpec()


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEShape:
    """Routed experts: `num_experts` of width `expert_intermediate_size`, `experts_per_token`
    active; `shared_intermediate_size` is the summed width of always-on shared experts;
    `dense_layers` decoder layers keep a plain MLP of the model's `intermediate_size`."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    dense_layers: int = 0
    expert_bias: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MLAShape:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one compressed latent of
    `kv_lora_rank` plus a shared rotary key of `qk_rope_head_dim` per token and layer."""

    kv_lora_rank: int
    q_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, slots=True, kw_only=True)
class VisionShape:
    """A vision tower declared by `vision_config`, enough to count its parameters and size the
    engine's encoder profiling pass."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int
    patch_size: int
    spatial_merge_size: int = 1
    num_tiles: int = 1
    # mllama: a class token per tile, patches padded to a multiple of 8, all tiles of an image
    # attending to one another through a dense (tokens × tokens) additive mask, and the outputs
    # of `intermediate_layers` layers kept until the tower ends.
    class_token: bool = False
    dense_tile_mask: bool = False
    intermediate_layers: int = 0
    output_size: int = 0
    encoder_decoder: bool = False

    @property
    def patches_per_image(self) -> int:
        side = max(1, self.image_size // max(1, self.patch_size))
        return side * side * self.num_tiles

    @property
    def tower_tokens_per_image(self) -> int:
        """Tokens one image puts through the tower (mllama: 4 tiles × (1,600 patches + a class
        token, padded to 1,608) = 6,432)."""
        side = max(1, self.image_size // max(1, self.patch_size))
        per_tile = side * side + (1 if self.class_token else 0)
        if self.dense_tile_mask:
            per_tile = -(-per_tile // 8) * 8
        return per_tile * self.num_tiles

    @property
    def llm_tokens_per_image(self) -> int:
        """Embeddings one image hands the language model (vLLM's max tokens per item): patches
        ÷ merge² (Pixtral 1540 px, patch 14, merge 2: 110² / 4 = 3,025); mllama's cross-attention
        reads all 4 × 1,601 = 6,404."""
        side = max(1, self.image_size // max(1, self.patch_size))
        if self.class_token:
            return (side * side + 1) * self.num_tiles
        return max(1, side * side * self.num_tiles // self.spatial_merge_size**2)


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorInfo:
    """One stored tensor: name, storage type (safetensors dtype or ggml type), elements, bytes."""

    name: str
    dtype: str
    numel: int
    nbytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointBytes:
    """What the weight files say, read without loading them.

    `tensors` lists every tensor when the headers were read; when only an index's
    `metadata.total_size` was available, `tensors` is empty and `total_bytes` holds that total.
    `format` is "safetensors" or "gguf".
    """

    format: str
    total_bytes: int
    tensors: tuple[TensorInfo, ...] = ()
    file_count: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """The numbers of one model that the formulas read. Lengths are in tokens, sizes in elements.

    Example (meta-llama/Llama-3.1-8B-Instruct): 32 layers, hidden 4096, 32 query heads, 8 KV
    heads of 128, MLP 14336, vocab 128256, untied, bfloat16.
    """

    name: str
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    gated_mlp: bool = True
    max_model_len: int = 2048
    sliding_window: int | None = None
    layer_kinds: tuple[LayerKind, ...] = ()
    moe: MoEShape | None = None
    mla: MLAShape | None = None
    vision: VisionShape | None = None
    linear_state: LinearStateShape | None = None
    quant: QuantSpec = field(default_factory=QuantSpec)
    checkpoint: CheckpointBytes | None = None

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        """One kind per decoder layer (all full attention unless the config says otherwise)."""
        return self.layer_kinds or (FULL,) * self.num_layers

    @property
    def attention_layers(self) -> int:
        """Layers that keep a per-token KV cache (full and sliding-window attention)."""
        return sum(1 for kind in self.kinds if kind != LINEAR)

    @property
    def linear_layers(self) -> int:
        """Layers that keep a fixed per-sequence state instead (mamba, linear attention)."""
        return self.num_layers - self.attention_layers

    def with_checkpoint(self, checkpoint: CheckpointBytes) -> ModelShape:
        return replace(self, checkpoint=checkpoint)


def _first(cfg: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return None


def _int(cfg: Mapping[str, Any], *keys: str, where: str, maximum: int = MAX_DIMENSION) -> int:
    value = _first(cfg, *keys)
    if value is None:
        raise UnsupportedModel(f"{where}: config has none of {', '.join(keys)}")
    number = whole_number(value, key=keys[0], where=where, maximum=maximum)
    if number <= 0:
        raise UnsupportedModel(f"{where}: {keys[0]} must be positive, got {value!r}")
    return number


def _dtype(cfg: Mapping[str, Any]) -> str:
    raw = _first(cfg, "torch_dtype", "dtype")
    text = str(raw or "bfloat16").removeprefix("torch.")
    if text not in DTYPE_BYTES:
        return "bfloat16"
    return text


def max_model_len_from_config(cfg: Mapping[str, Any]) -> int | None:
    """The longest context the config allows, as vLLM derives it: the smallest of the length
    keys present, multiplied by the rope scaling factor for the rope types that stretch it
    (yarn, dynamic, linear) — e.g. gpt-oss-20b: yarn, 4096 original × 32 = 131,072 tokens."""
    lengths = [
        whole_number(cfg[k], key=k, where="config")
        for k in _LENGTH_KEYS
        if isinstance(cfg.get(k), int | float) and not isinstance(cfg.get(k), bool)
    ]
    if not lengths:
        return None
    derived = min(lengths)
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, Mapping):
        rope_type = str(scaling.get("rope_type") or scaling.get("type") or "default")
        factor = ratio(scaling.get("factor"), 0.0)
        if rope_type not in _ROPE_TYPES_WITHOUT_LENGTH_SCALING and factor:
            original = opt_int(scaling, "original_max_position_embeddings")
            base = original if original is not None else derived
            derived = min(int(base * factor), MAX_DIMENSION)
    return derived


def _layer_kinds(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[str, ...]:
    declared = cfg.get("layer_types")
    if isinstance(declared, list) and len(declared) == num_layers:
        kinds = []
        for entry in declared:
            text = str(entry)
            if text in ("full_attention", "attention", "global"):
                kinds.append(FULL)
            elif "sliding" in text or text in ("local", "chunked_attention"):
                kinds.append(SLIDING)
            else:
                kinds.append(LINEAR)
        return tuple(kinds)
    interval = opt_int(cfg, "full_attention_interval")
    if interval and interval > 1:  # Qwen3-Next: every 4th layer is full attention
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers))
    period = opt_int(cfg, "attn_layer_period")
    if period and period > 0 and "attn_layer_offset" in cfg:  # Jamba: attention 1 in 8
        offset = opt_int(cfg, "attn_layer_offset") or 0
        return tuple(FULL if i % period == offset else LINEAR for i in range(num_layers))
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or cfg.get("use_sliding_window") is False:
        return ()
    if model_type == "gemma2":
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(num_layers))
    pattern = opt_int(cfg, "sliding_window_pattern")
    if pattern and pattern > 1:
        return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers))
    return (SLIDING,) * num_layers


def _moe(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> MoEShape | None:
    experts = opt_int(
        cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"
    )
    if not experts or experts <= 1:
        return None
    where = f"{model_type} MoE"
    top_k = _int(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_top_k", where=where)
    width = _int(cfg, "moe_intermediate_size", "intermediate_size", where=where)
    shared = 0
    n_shared = opt_int(cfg, "n_shared_experts", "num_shared_experts")
    if n_shared:
        shared = n_shared * width
    shared = opt_int(cfg, "shared_expert_intermediate_size") or shared
    dense = opt_int(cfg, "first_k_dense_replace") or 0
    mlp_only = cfg.get("mlp_only_layers")
    if isinstance(mlp_only, list):
        dense += len(mlp_only)
    step = opt_int(cfg, "decoder_sparse_step")
    if step and step > 1:
        dense = sum(1 for i in range(num_layers) if (i + 1) % step != 0)
    return MoEShape(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=width,
        shared_intermediate_size=shared,
        dense_layers=min(dense, num_layers),
        expert_bias=model_type == "gpt_oss",
    )


def _mla(cfg: Mapping[str, Any]) -> MLAShape | None:
    rank = opt_int(cfg, "kv_lora_rank")
    if not rank:
        return None
    return MLAShape(
        kv_lora_rank=rank,
        q_lora_rank=opt_int(cfg, "q_lora_rank") or 0,
        qk_nope_head_dim=opt_int(cfg, "qk_nope_head_dim") or 128,
        qk_rope_head_dim=opt_int(cfg, "qk_rope_head_dim") or 64,
        v_head_dim=opt_int(cfg, "v_head_dim") or 128,
    )


def _vision(top: Mapping[str, Any]) -> VisionShape | None:
    vc = top.get("vision_config")
    if not isinstance(vc, Mapping):
        return None
    hidden = opt_int(vc, "hidden_size", "embed_dim", "width")
    layers = opt_int(vc, "num_hidden_layers", "depth", "num_layers", "layers")
    if not hidden or not layers:
        return None
    intermediate = opt_int(vc, "intermediate_size")
    if not intermediate:
        intermediate = int(hidden * ratio(vc.get("mlp_ratio"), 4))
    global_layers = opt_int(vc, "num_global_layers") or 0
    merge = opt_int(vc, "spatial_merge_size") or opt_int(top, "spatial_merge_size") or 1
    mllama = str(top.get("model_type", "")) == "mllama"
    indices = vc.get("intermediate_layers_indices")
    intermediate_layers = len(indices) if isinstance(indices, list) else 0
    output_size = opt_int(vc, "vision_output_dim") or 0
    if mllama and not intermediate_layers and output_size:
        intermediate_layers = max(0, output_size // hidden - 1)
    return VisionShape(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers + global_layers,
        num_heads=opt_int(vc, "num_attention_heads", "attention_heads", "num_heads", "heads")
        or max(1, hidden // 64),
        image_size=opt_int(vc, "image_size") or 448,
        patch_size=opt_int(vc, "patch_size") or 14,
        spatial_merge_size=merge,
        num_tiles=opt_int(vc, "max_num_tiles") or 1,
        class_token=mllama,
        dense_tile_mask=mllama,
        intermediate_layers=intermediate_layers,
        output_size=output_size,
        encoder_decoder=mllama,
    )


def quant_from_config(qc: Mapping[str, Any] | None, *, where: str) -> QuantSpec:
    """Read `quantization_config`: AWQ, GPTQ, FP8 (incl. fbgemm and compressed-tensors),
    bitsandbytes and mxfp4. Raises UnsupportedModel for a method we do not model."""
    if not qc:
        return NO_QUANT
    if not isinstance(qc, Mapping):
        raise UnsupportedModel(f"{where}: quantization_config is {qc!r}, expected an object")
    method = str(qc.get("quant_method", "")).lower().replace("-", "_")
    skip = tuple(str(m) for m in (qc.get("modules_to_not_convert") or qc.get("ignore") or []) if m)
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin", "marlin"):
        bits = opt_int(qc, "bits", "w_bit") or 4
        group = opt_int(qc, "group_size", "q_group_size")
        kind = "awq" if method.startswith("awq") else "gptq"
        return QuantSpec(
            method=kind, bits=bits, group_size=max(0, group or 128), modules_to_not_convert=skip
        )
    if method in ("fp8", "fbgemm_fp8", "modelopt"):
        return QuantSpec(method="fp8", bits=8, modules_to_not_convert=skip)
    if method == "compressed_tensors":
        groups = qc.get("config_groups") or {}
        for group in groups.values() if isinstance(groups, Mapping) else []:
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if not isinstance(weights, Mapping):
                continue
            bits = opt_int(weights, "num_bits") or 8
            if str(weights.get("type", "")).lower() == "float" and bits == 8:
                return QuantSpec(method="fp8", bits=8, modules_to_not_convert=skip)
            size = opt_int(weights, "group_size") or 0
            return QuantSpec(method="gptq", bits=bits, group_size=size, modules_to_not_convert=skip)
        return QuantSpec(method="fp8", bits=8, modules_to_not_convert=skip)
    if method == "bitsandbytes":
        bits = 8 if qc.get("load_in_8bit") else 4
        return QuantSpec(
            method="bitsandbytes", bits=bits, group_size=64, modules_to_not_convert=skip
        )
    if method == "mxfp4":
        return QuantSpec(method="mxfp4", bits=4, group_size=32, modules_to_not_convert=skip)
    raise UnsupportedModel(f"{where}: quantization method {method or '(none)'!r} is not modelled")


def shape_from_config(cfg: Mapping[str, Any], *, name: str = "model") -> ModelShape:
    """Build a ModelShape from a parsed config.json (text settings may sit in `text_config`).

    Raises UnsupportedModel when a needed number is missing or the quantization is unknown.
    """
    if not isinstance(cfg, Mapping):
        raise UnsupportedModel(f"{name}: config.json is not a JSON object")
    text: Mapping[str, Any] = cfg
    if isinstance(cfg.get("text_config"), Mapping):
        text = {**{k: v for k, v in cfg.items() if k != "text_config"}, **cfg["text_config"]}
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        architecture = str(archs[0])
    else:
        architecture = str(cfg.get("model_type") or "unknown")
    model_type = str(text.get("model_type") or cfg.get("model_type") or "").lower()
    where = name
    hidden = _int(text, "hidden_size", "n_embd", "d_model", where=where)
    layers = _int(
        text, "num_hidden_layers", "n_layer", "num_layers", where=where, maximum=MAX_LAYERS
    )
    heads = _int(text, "num_attention_heads", "n_head", where=where)
    kv_heads = opt_int(text, "num_key_value_heads", "n_head_kv", "num_kv_heads")
    if kv_heads is None:
        kv_heads = 1 if text.get("multi_query") else heads
    head_dim = opt_int(text, "head_dim") or hidden // heads
    moe = _moe(text, model_type, layers)
    intermediate = opt_int(text, "intermediate_size", "ffn_hidden_size", "n_inner")
    if intermediate is None:
        if moe is None and model_type not in _NON_GATED_TYPES:
            raise UnsupportedModel(f"{where}: config has no intermediate_size")
        intermediate = moe.expert_intermediate_size if moe else 4 * hidden
    vocab = _int(text, "vocab_size", "padded_vocab_size", where=where)
    quant = quant_from_config(
        cfg.get("quantization_config") or text.get("quantization_config"), where=where
    )
    mlx = cfg.get("quantization")
    bits = opt_int(mlx, "bits") if isinstance(mlx, Mapping) else None
    if not quant.is_quantized and isinstance(mlx, Mapping) and bits:
        # mlx-community checkpoints: {"group_size": 64, "bits": 4}, fp16 scale and bias per group
        quant = QuantSpec(method="mlx", bits=bits, group_size=opt_int(mlx, "group_size") or 64)
    tie = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    if tie is None:
        tie = model_type in _TIED_BY_DEFAULT
    attention_bias = bool(text.get("attention_bias", False))
    window = opt_int(text, "sliding_window") or None
    return ModelShape(
        name=name,
        architecture=architecture,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        dtype=_dtype(text if _first(text, "torch_dtype", "dtype") else cfg),
        tie_word_embeddings=bool(tie),
        qkv_bias=attention_bias or model_type in _QKV_BIAS_TYPES,
        o_bias=attention_bias,
        mlp_bias=bool(text.get("mlp_bias", False)),
        gated_mlp=model_type not in _NON_GATED_TYPES,
        max_model_len=max_model_len_from_config(text) or 2048,
        sliding_window=window,
        layer_kinds=_layer_kinds(text, model_type, layers),
        moe=moe,
        mla=_mla(text),
        vision=_vision(cfg),
        linear_state=linear_state_from_config(text, hidden_size=hidden),
        quant=quant,
    )
