"""Repos the Hub stand-in serves: a tiny GGUF repo with three quantization variants that
llama.cpp really loads (tinymodel's random-weight models, one seed per variant), and a
7B-shaped repo whose variants are GGUF headers declaring full-size tensors (Q4_K, Q8_0, F16:
about 3.6, 6.7 and 12.6 GiB of weights) over zeros never written anywhere."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gguf
import numpy as np

from cohabit.runtime.tinymodel import TinyModelShape, write_tiny_model
from tests.hub.standin import HubFileSpec, HubRepoSpec

TINY_REPO = "cohabit-test/tiny-llama-GGUF"
# Variant → its shape: growing sizes (0.4, 1.6 and 22 MiB), the largest past huggingface_hub's
# 10 MiB download chunk so a download killed half way leaves a part to resume.
TINY_VARIANTS = {
    "Q4_K_M": TinyModelShape(),
    "Q8_0": TinyModelShape(n_embd=256, n_heads=4, n_kv_heads=2, n_ff=512),
    "F16": TinyModelShape(n_embd=512, n_heads=8, n_kv_heads=4, n_ff=1024),
}
BIG_REPO = "cohabit-test/Llama-7B-GGUF"
README = b"# tiny llama\n\nRandom weights, for tests.\n"


def tiny_repo() -> HubRepoSpec:
    files = {"README.md": HubFileSpec(head=README, size=len(README), lfs=False)}
    with tempfile.TemporaryDirectory() as folder:
        for seed, (variant, shape) in enumerate(TINY_VARIANTS.items()):
            name = f"tiny-llama-{variant}.gguf"
            data = write_tiny_model(Path(folder) / name, seed=seed, shape=shape).read_bytes()
            files[name] = HubFileSpec(head=data, size=len(data))
    return HubRepoSpec(repo_id=TINY_REPO, files=files)


_BIG = {"n_layers": 32, "n_embd": 4096, "n_ff": 11008, "n_heads": 32, "n_kv": 8, "vocab": 32000}
_TYPES = {
    "Q4_K_M": gguf.GGMLQuantizationType.Q4_K,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "F16": gguf.GGMLQuantizationType.F16,
}


def big_repo() -> HubRepoSpec:
    files = {"README.md": HubFileSpec(head=README, size=len(README), lfs=False)}
    for variant, kind in _TYPES.items():
        head, size = _header_only(kind)
        files[f"llama-7b-{variant}.gguf"] = HubFileSpec(head=head, size=size)
    return HubRepoSpec(repo_id=BIG_REPO, files=files, commit="c0ffee" * 6 + "c0ff")


def _header_only(kind: gguf.GGMLQuantizationType) -> tuple[bytes, int]:
    """A GGUF's header and tensor table for a Llama-2-7B-shaped model (GQA 32/8); the
    returned size counts the tensor data that would follow."""
    s = _BIG
    kv = s["n_embd"] * s["n_kv"] // s["n_heads"]
    shapes = {
        "token_embd.weight": (s["vocab"], s["n_embd"]),
        "output.weight": (s["vocab"], s["n_embd"]),
    }
    shapes["output_norm.weight"] = (s["n_embd"],)
    for layer in range(s["n_layers"]):
        b = f"blk.{layer}."
        shapes |= {
            b + "attn_norm.weight": (s["n_embd"],),
            b + "ffn_norm.weight": (s["n_embd"],),
            b + "attn_q.weight": (s["n_embd"], s["n_embd"]),
            b + "attn_k.weight": (kv, s["n_embd"]),
            b + "attn_v.weight": (kv, s["n_embd"]),
            b + "attn_output.weight": (s["n_embd"], s["n_embd"]),
            b + "ffn_gate.weight": (s["n_ff"], s["n_embd"]),
            b + "ffn_up.weight": (s["n_ff"], s["n_embd"]),
            b + "ffn_down.weight": (s["n_embd"], s["n_ff"]),
        }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "head.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_name("llama-7b")
        writer.add_context_length(4096)
        writer.add_embedding_length(s["n_embd"])
        writer.add_block_count(s["n_layers"])
        writer.add_feed_forward_length(s["n_ff"])
        writer.add_head_count(s["n_heads"])
        writer.add_head_count_kv(s["n_kv"])
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_dimension_count(s["n_embd"] // s["n_heads"])
        writer.add_vocab_size(s["vocab"])
        data_bytes = 0
        for name, shape in shapes.items():
            norm = len(shape) == 1
            kind_here = gguf.GGMLQuantizationType.F32 if norm else kind
            block, type_size = gguf.GGML_QUANT_SIZES[kind_here]
            count = 1
            for dim in shape:
                count *= dim
            nbytes = count // block * type_size
            # The writer takes a quantized tensor's shape in bytes per row.
            byte_shape = (*shape[:-1], shape[-1] // block * type_size)
            writer.add_tensor_info(name, byte_shape, np.uint8, nbytes, raw_dtype=kind_here)
            data_bytes += gguf.GGUFWriter.ggml_pad(nbytes, gguf.GGUF_DEFAULT_ALIGNMENT)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        head = path.read_bytes()
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    return head, gguf.GGUFWriter.ggml_pad(len(head), alignment) + data_bytes
