"""A tiny real model for tests and the demo: a seeded, random-weight LLaMA-architecture GGUF
with a byte-level vocabulary that llama.cpp loads and serves with no download.

    python -m cohabit.runtime.tinymodel OUT.gguf [--seed N]

The defaults (2 layers, width 64, 4 heads over 2 KV heads, context 256) write ~0.4 MiB in a
few milliseconds; llama-cpp-python's server answers in about a second on a laptop CPU.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, BOS, EOS
# A few whole pieces besides the 256 byte tokens, so the SPM tokenizer has something to merge.
PIECES = ("▁", "▁the", "▁a", "▁is", "▁and", "▁to", "▁of", "▁hello", "er", "in", "on", "an")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_PRINTABLE = range(0x20, 0x7F)


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyModelShape:
    """The tiny model's dimensions (all small; the vocabulary is fixed)."""

    n_layers: int = 2
    n_embd: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    n_ff: int = 128
    context_length: int = 256
    rms_eps: float = 1e-5


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: specials, every byte as <0xNN>, then PIECES."""
    tokens = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *PIECES]
    types = [
        int(gguf.TokenType.UNKNOWN),
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.CONTROL),
        *[int(gguf.TokenType.BYTE)] * 256,
        *[int(gguf.TokenType.NORMAL)] * len(PIECES),
    ]
    scores = [0.0] * (len(SPECIALS) + 256) + [-float(i + 1) for i in range(len(PIECES))]
    return tokens, scores, types


def _output_rows(rng: np.random.Generator, vocab: int, n_embd: int) -> np.ndarray:
    """The output layer. Random weights would emit lone bytes ≥ 0x80, which llama-cpp-python
    holds back as incomplete UTF-8 without counting them against max_tokens (it can then run
    until the context is full); zero rows for specials, control bytes and bytes ≥ 0x80 and
    strong rows for printable ASCII make replies exactly max_tokens long and repeatable."""
    rows = np.zeros((vocab, n_embd), dtype=np.float32)
    offset = len(SPECIALS)
    for byte in _PRINTABLE:
        rows[offset + byte] = rng.normal(0.0, 1.0, n_embd)
    first_piece = offset + 256
    rows[first_piece:] = rng.normal(0.0, 0.1, (vocab - first_piece, n_embd))
    return rows


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    shape: TinyModelShape | None = None,
    name: str = "tiny-llama",
) -> Path:
    """Write the model to `path` (parents created) and return it. The same seed and shape
    always give the same bytes."""
    shape = shape or TinyModelShape()
    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    vocab = len(tokens)
    head_dim = shape.n_embd // shape.n_heads
    kv_width = shape.n_kv_heads * head_dim

    def weight(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, (rows, cols)).astype(np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layers)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
    ones = np.ones(shape.n_embd, dtype=np.float32)
    # numpy shapes are (out, in); the writer stores them reversed, as GGUF wants.
    writer.add_tensor("token_embd.weight", weight(vocab, shape.n_embd))
    for layer in range(shape.n_layers):
        block = f"blk.{layer}."
        writer.add_tensor(block + "attn_norm.weight", ones)
        writer.add_tensor(block + "attn_q.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(block + "attn_k.weight", weight(kv_width, shape.n_embd))
        writer.add_tensor(block + "attn_v.weight", weight(kv_width, shape.n_embd))
        writer.add_tensor(block + "attn_output.weight", weight(shape.n_embd, shape.n_embd))
        writer.add_tensor(block + "ffn_norm.weight", ones)
        writer.add_tensor(block + "ffn_gate.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(block + "ffn_up.weight", weight(shape.n_ff, shape.n_embd))
        writer.add_tensor(block + "ffn_down.weight", weight(shape.n_embd, shape.n_ff))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", _output_rows(rng, vocab, shape.n_embd))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cohabit.runtime.tinymodel",
        description="Write a tiny random-weight LLaMA GGUF that llama.cpp can serve.",
    )
    parser.add_argument("out", type=Path, help="where to write the .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--name", default="tiny-llama", help="general.name in the file")
    args = parser.parse_args(argv)
    try:
        written = write_tiny_model(args.out, seed=args.seed, name=args.name)
    except OSError as err:
        print(f"error: cannot write {args.out}: {err.strerror or err}", file=sys.stderr)
        return 1
    print(f"wrote {written} ({written.stat().st_size} bytes, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
