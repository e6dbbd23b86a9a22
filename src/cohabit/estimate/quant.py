"""Bytes per stored weight for each quantization scheme, and llama.cpp's per-tensor type mix
for GGUF file types. `weights.py` multiplies these by parameter counts.
"""

from __future__ import annotations

from fractions import Fraction

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.shape import QuantSpec

SCALE_BYTES = 2  # fp16 group scales of AWQ / GPTQ / MLX


def ggml_type_bytes(type_name: str) -> Fraction:
    """Bytes per element of a ggml tensor type: Q4_K packs 256 weights in 144 bytes (4.5 bits),
    Q8_0 packs 32 in 34 (8.5 bits), F16 is 2."""
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        raise InvalidSetting(f"unknown ggml tensor type {type_name!r}") from None
    return Fraction(size, block)


def linear_weight_bytes(quant: QuantSpec, act_bytes: int) -> Fraction:
    """Bytes per weight of a quantized linear layer, scales and zero points included.

    AWQ/GPTQ 4-bit, group 128: 0.5 + (2 + 0.5) / 128 ≈ 0.5195 bytes (Llama-3.1-8B-AWQ: its
    6.98 G decoder weights take 3.63 GB). FP8: 1 byte (per-channel or 128×128-block scales add
    under 0.1%). bitsandbytes NF4: 0.5 + 4/64 (an fp32 absmax per 64 weights). mxfp4: 4 bits +
    one 8-bit exponent per 32 = 0.53125. Unquantized: the activation dtype's bytes.
    """
    method = quant.method
    if method in ("awq", "gptq"):
        packed = Fraction(quant.bits, 8)
        if quant.group_size > 0:
            return packed + (SCALE_BYTES + packed) / quant.group_size
        return packed
    if method == "fp8":
        return Fraction(1)
    if method == "bitsandbytes":
        return Fraction(1) if quant.bits == 8 else Fraction(1, 2) + Fraction(4, 64)
    if method == "mxfp4":
        return Fraction(1, 2) + Fraction(1, 32)
    if method == "mlx":
        return Fraction(quant.bits, 8) + Fraction(2 * SCALE_BYTES, quant.group_size or 64)
    return Fraction(act_bytes)


# llama.cpp file types: the base ggml type of the big matrices.
_GGUF_BASE = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q8_0": "Q8_0",
    "Q6_K": "Q6_K",
    "Q5_K_M": "Q5_K",
    "Q5_K_S": "Q5_K",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q4_K_M": "Q4_K",
    "Q4_K_S": "Q4_K",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "IQ4_XS": "IQ4_XS",
    "IQ4_NL": "IQ4_NL",
    "Q3_K_M": "Q3_K",
    "Q3_K_L": "Q3_K",
    "Q3_K_S": "Q3_K",
    "Q2_K": "Q2_K",
}


def gguf_file_types() -> tuple[str, ...]:
    return tuple(_GGUF_BASE)


def _use_more_bits(layer: int, n_layers: int) -> bool:
    # llama.cpp (src/llama-quant.cpp): the first and last eighth of the layers, and every
    # third layer between them, get the larger type for attn_v and ffn_down.
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def gguf_tensor_type(file_type: str, role: str, layer: int, n_layers: int) -> str:
    """The ggml type llama.cpp's quantizer gives one tensor of a file type.

    `role` is token_embd, output, attn_v, ffn_down, norm or other. Q4_K_M on Llama-3-8B: attn_v
    and ffn_down are Q6_K on 16 of 32 layers, output Q6_K, the rest Q4_K — 4,403 MiB of GPU
    weights with token_embd (282 MiB) left on the host, as llama.cpp prints.
    """
    key = file_type.upper()
    if key not in _GGUF_BASE:
        raise InvalidSetting(
            f"unknown GGUF file type {file_type!r} (known: {', '.join(_GGUF_BASE)})"
        )
    base = _GGUF_BASE[key]
    if role == "norm":
        return "F32"
    if base in ("F32", "F16", "BF16", "Q8_0"):
        return base
    if role == "output":
        return "Q6_K"
    if role in ("attn_v", "ffn_down") and key in ("Q4_K_M", "Q5_K_M"):
        return "Q6_K" if _use_more_bits(layer, n_layers) else base
    if role in ("attn_v", "ffn_down") and key in ("Q3_K_M", "Q3_K_L"):
        return "Q5_K" if role == "attn_v" or _use_more_bits(layer, n_layers) else "Q4_K"
    return base
