"""Tiny model files the estimator tests write into tmp dirs: a LLaMA-shaped config.json with
safetensors shards (or only an index), and a GGUF file — random-free zeros, a few KiB each."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 64, 2, 4, 2, 128, 256
HEAD_DIM = HIDDEN // HEADS

TINY_CONFIG: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "intermediate_size": FFN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}


def tiny_tensors(dtype: type = np.float16) -> dict[str, np.ndarray]:
    """HF LLaMA tensor names and shapes (out, in) for the tiny config."""
    kv = KV_HEADS * HEAD_DIM
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": np.zeros((VOCAB, HIDDEN), dtype),
        "model.norm.weight": np.zeros((HIDDEN,), dtype),
        "lm_head.weight": np.zeros((VOCAB, HIDDEN), dtype),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.zeros((HIDDEN,), dtype),
            p + "post_attention_layernorm.weight": np.zeros((HIDDEN,), dtype),
            p + "self_attn.q_proj.weight": np.zeros((HIDDEN, HIDDEN), dtype),
            p + "self_attn.k_proj.weight": np.zeros((kv, HIDDEN), dtype),
            p + "self_attn.v_proj.weight": np.zeros((kv, HIDDEN), dtype),
            p + "self_attn.o_proj.weight": np.zeros((HIDDEN, HIDDEN), dtype),
            p + "mlp.gate_proj.weight": np.zeros((FFN, HIDDEN), dtype),
            p + "mlp.up_proj.weight": np.zeros((FFN, HIDDEN), dtype),
            p + "mlp.down_proj.weight": np.zeros((HIDDEN, FFN), dtype),
        }
    return tensors


def tensor_bytes(tensors: dict[str, np.ndarray]) -> int:
    return sum(t.nbytes for t in tensors.values())


def write_safetensors_model(
    directory: Path, *, shards: int = 2, dtype: type = np.float16, extra_bytes: int = 0
) -> int:
    """config.json + `shards` safetensors files; returns the tensor bytes written.

    `extra_bytes` pads the embedding with that many extra fp16 rows' worth of vocabulary so
    the exact bytes differ from what the config alone derives.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(TINY_CONFIG)
    if dtype is np.float32:
        config["torch_dtype"] = "float32"
    (directory / "config.json").write_text(json.dumps(config))
    tensors = tiny_tensors(dtype)
    if extra_bytes:
        tensors["model.extra_buffer"] = np.zeros((extra_bytes // 2,), np.float16)
    names = sorted(tensors)
    for index in range(shards):
        part = {n: tensors[n] for n in names[index::shards]}
        save_file(part, str(directory / f"model-{index + 1:05d}-of-{shards:05d}.safetensors"))
    return tensor_bytes(tensors)


def write_index_only_model(directory: Path, total_size: int) -> None:
    """config.json + model.safetensors.index.json, no shards (weights not downloaded yet)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    index = {"metadata": {"total_size": total_size}, "weight_map": {}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def write_gguf_model(path: Path, *, tied: bool = False) -> dict[str, int]:
    """A LLaMA GGUF (f16 matrices, f32 norms); returns tensor bytes by place."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}".encode() for i in range(VOCAB)])
    places = {"token_embd": 0, "output": 0, "layers": 0}

    def add(name: str, shape: tuple[int, ...], place: str) -> None:
        dtype = np.float32 if len(shape) == 1 else np.float16
        array = np.zeros(shape, dtype)
        writer.add_tensor(name, array)
        places[place] += array.nbytes

    add("token_embd.weight", (VOCAB, HIDDEN), "token_embd")
    add("output_norm.weight", (HIDDEN,), "output")
    if not tied:
        add("output.weight", (VOCAB, HIDDEN), "output")
    kv = KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        for name, shape in (
            ("attn_norm", (HIDDEN,)),
            ("ffn_norm", (HIDDEN,)),
            ("attn_q", (HIDDEN, HIDDEN)),
            ("attn_k", (kv, HIDDEN)),
            ("attn_v", (kv, HIDDEN)),
            ("attn_output", (HIDDEN, HIDDEN)),
            ("ffn_gate", (FFN, HIDDEN)),
            ("ffn_up", (FFN, HIDDEN)),
            ("ffn_down", (HIDDEN, FFN)),
        ):
            add(f"blk.{i}.{name}.weight", shape, "layers")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return places
