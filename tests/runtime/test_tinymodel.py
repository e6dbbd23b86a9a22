"""The tiny GGUF generator: deterministic, readable as a LLaMA shape, usable from a shell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf

from cohabit.estimate.checkpoint import load_shape
from cohabit.runtime.tinymodel import PIECES, SPECIALS, write_tiny_model


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    first = write_tiny_model(tmp_path / "a.gguf", seed=1).read_bytes()
    again = write_tiny_model(tmp_path / "b.gguf", seed=1).read_bytes()
    other = write_tiny_model(tmp_path / "c.gguf", seed=2).read_bytes()
    assert first == again
    assert first != other
    assert len(first) < 512 * 1024


def test_shape_is_a_small_llama(tmp_path: Path) -> None:
    shape = load_shape(write_tiny_model(tmp_path / "tiny.gguf"))
    assert (shape.architecture, shape.num_layers, shape.hidden_size) == ("llama", 2, 64)
    assert (shape.num_heads, shape.num_kv_heads, shape.max_model_len) == (4, 2, 256)
    assert shape.vocab_size == len(SPECIALS) + 256 + len(PIECES)


def test_byte_tokens_are_typed_as_bytes(tmp_path: Path) -> None:
    reader = gguf.GGUFReader(write_tiny_model(tmp_path / "tiny.gguf"))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert tokens[3 + 0x41] == "<0x41>"
    assert types[3 + 0x41] == gguf.TokenType.BYTE
    assert types[:3] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]


def test_command_line(tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "cohabit.runtime.tinymodel", str(out), "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} (") and out.is_file()


def test_command_line_unwritable_path_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "cohabit.runtime.tinymodel", str(blocker / "tiny.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot write {blocker / 'tiny.gguf'}: ")
    assert len(done.stderr.strip().splitlines()) == 1
