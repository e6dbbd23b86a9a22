"""Model files from anywhere: a crafted GGUF, safetensors or config.json header is one
EstimateError line naming the file and the damage, raised before anything is allocated for
what the header claims and within well under the 2 s a request may spend on it."""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from cohabit.estimate import EstimateError, UnsupportedModel, checkpoint, estimate_model, ggufheader
from cohabit.estimate.checkpoint import load_shape, read_safetensors_header
from cohabit.estimate.ggufheader import GGUFArray, read_gguf_header
from cohabit.runtime.tinymodel import write_tiny_model
from tests.conftest import run_cli
from tests.estimate.tinymodels import TINY_CONFIG, write_gguf_model, write_safetensors_model

TOKENS_KEY = b"tokenizer.ggml.tokens"


def array_count_offset(data: bytes, key: bytes) -> int:
    """Where a metadata array's u64 item count sits: after the key, its u32 type (ARRAY) and
    the u32 item type."""
    return data.index(key) + len(key) + 4 + 4


def patched(path: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    out = path.with_name("crafted-" + path.name)
    out.write_bytes(bytes(data))
    return out


def one_line_error(call: object, *args: object) -> tuple[str, float]:
    t0 = time.perf_counter()
    with pytest.raises(EstimateError) as caught:
        call(*args)  # type: ignore[operator]
    elapsed = time.perf_counter() - t0
    message = str(caught.value)
    assert "\n" not in message
    return message, elapsed


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "model.gguf")


def test_header_matches_the_gguf_librarys_reading(tiny_gguf: Path) -> None:
    """On a sound file our bounded reader sees what gguf-py's full reader sees."""
    ours = read_gguf_header(tiny_gguf)
    theirs = gguf.GGUFReader(tiny_gguf)
    assert [(t.name, t.dtype, t.numel, t.nbytes) for t in ours.tensors] == [
        (t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes)) for t in theirs.tensors
    ]
    assert ours.data_offset == theirs.data_offset
    tokens = ours.metadata["tokenizer.ggml.tokens"]
    assert tokens.length == len(theirs.fields["tokenizer.ggml.tokens"].data)  # type: ignore[union-attr]
    assert ours.metadata["general.architecture"] == "llama"
    assert ours.metadata["llama.block_count"] == theirs.fields["llama.block_count"].contents()


def test_array_count_of_a_billion_is_one_line_at_once(tiny_gguf: Path) -> None:
    """The reproducer: gguf's own reader allocated 14.5 GB on this file."""
    data = tiny_gguf.read_bytes()
    crafted = patched(tiny_gguf, array_count_offset(data, TOKENS_KEY), "<Q", 10**9)
    tracemalloc.start()
    try:
        message, elapsed = one_line_error(estimate_model, crafted)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 0.5
    assert peak_bytes < 4 * 1024 * 1024  # the read window and little else
    assert message.startswith(f"{crafted}: not a readable GGUF file: metadata array ")
    assert "'tokenizer.ggml.tokens' claims 1,000,000,000 items but only" in message
    assert "bytes remain" in message


def test_cli_prints_the_one_line_and_exits_non_zero(tiny_gguf: Path) -> None:
    data = tiny_gguf.read_bytes()
    crafted = patched(tiny_gguf, array_count_offset(data, TOKENS_KEY), "<Q", 10**9)
    result = run_cli("estimate", str(crafted))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "claims 1,000,000,000 items" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("where", "fmt", "value", "expected"),
    [
        pytest.param(
            8, "<Q", 10**12, "tensor count 1,000,000,000,000 needs at least", id="tensors"
        ),
        pytest.param(16, "<Q", 60_000, "key/value count 60,000 needs at least", id="keys"),
        pytest.param(4, "<I", 1, "GGUF version 1", id="version"),
        pytest.param(24, "<Q", 2**63, "key 0 claims 9,223,372,036,854,775,808 bytes", id="key"),
        pytest.param(0, "<I", 0x46554746, "no GGUF magic", id="magic"),
    ],
)
def test_header_counts_are_checked_first(
    tiny_gguf: Path, where: int, fmt: str, value: int, expected: str
) -> None:
    message, elapsed = one_line_error(load_shape, patched(tiny_gguf, where, fmt, value))
    assert expected in message
    assert elapsed < 0.5


def test_string_items_cannot_overrun_the_file(tiny_gguf: Path) -> None:
    data = tiny_gguf.read_bytes()
    first_item = array_count_offset(data, TOKENS_KEY) + 8
    message, _ = one_line_error(load_shape, patched(tiny_gguf, first_item, "<Q", 2**40))
    assert "'tokenizer.ggml.tokens' item 0 claims 1,099,511,627,776 bytes" in message


def test_nested_arrays_are_refused(tiny_gguf: Path) -> None:
    data = tiny_gguf.read_bytes()
    item_type = array_count_offset(data, TOKENS_KEY) - 4
    message, _ = one_line_error(load_shape, patched(tiny_gguf, item_type, "<I", 9))
    assert "'tokenizer.ggml.tokens' has item type 9, which is not allowed" in message


def test_truncated_tensor_data_is_refused(tiny_gguf: Path) -> None:
    data = tiny_gguf.read_bytes()
    cut = tiny_gguf.with_name("cut.gguf")
    cut.write_bytes(data[:-100])
    message, _ = one_line_error(load_shape, cut)
    assert "ends at byte" in message
    assert f"of a {len(data) - 100:,}-byte file" in message


def test_layer_count_in_gguf_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    write_gguf_model(path)
    key = b"llama.block_count"
    offset = path.read_bytes().index(key) + len(key) + 4  # after the u32 type (UINT32)
    message, _ = one_line_error(load_shape, patched(path, offset, "<I", 4_000_000_000))
    assert "llama.block_count is 4,000,000,000, outside 0..10,000" in message


def test_a_large_vocabulary_is_walked_quickly(tmp_path: Path) -> None:
    """150,000 tokens (~2.5 MiB of strings, several read windows): counted right, and in well
    under a second — real vocabularies reach 262,144 tokens."""
    path = tmp_path / "big-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"token-{i:010d}".encode() for i in range(150_000)])
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    t0 = time.perf_counter()
    header = read_gguf_header(path)
    elapsed = time.perf_counter() - t0
    tokens = header.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFArray) and tokens.length == 150_000
    assert [(t.name, t.nbytes) for t in header.tensors] == [("token_embd.weight", 32 * 64 * 2)]
    assert elapsed < 1.0


def test_header_reading_has_a_time_ceiling(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ggufheader, "MAX_SECONDS", 0.0)
    message, _ = one_line_error(load_shape, tiny_gguf)
    assert "header takes over 0 s to read" in message


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("model.gguf", "model.gguf: not a regular file", id="gguf"),
        pytest.param("model.safetensors", "model.safetensors: not a regular file", id="shard"),
        pytest.param("config.json", "no config.json (and not exactly one .gguf)", id="config"),
    ],
)
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, name: str, expected: str) -> None:
    """A FIFO named like a model file would block the reader forever (and, in the spawner,
    the device's lock with it)."""
    if name == "model.safetensors":
        (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    os.mkfifo(tmp_path / name)
    message, elapsed = one_line_error(load_shape, tmp_path)
    assert expected in message
    assert elapsed < 1.0


# --- safetensors -------------------------------------------------------------------------


def safetensors_file(tmp_path: Path, header: dict[str, object], data_bytes: int) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    raw = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data_bytes))
    return path


@pytest.mark.parametrize(
    ("header", "data_bytes", "expected"),
    [
        pytest.param(
            {"w": {"dtype": "F16", "shape": [2, 2]}},
            8,
            "tensor 'w': no data_offsets",
            id="no-offsets",
        ),
        pytest.param(
            {"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 6]}},
            6,
            "F16 shape [2, 2] is 8 bytes but data_offsets span 6",
            id="span",
        ),
        pytest.param(
            {"w": {"dtype": "F16", "shape": [2, "2"], "data_offsets": [0, 8]}},
            8,
            "shape [2, '2'] is not a list of whole numbers",
            id="shape-type",
        ),
        pytest.param(
            {"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 2]}},
            2,
            "unknown dtype 'Q9'",
            id="dtype",
        ),
        pytest.param(
            {"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}},
            2,
            "tensors end at data byte 4 but the data section holds 2 bytes",
            id="past-the-end",
        ),
        pytest.param(
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            3,
            "tensor 'b' starts at data byte 1, expected 2",
            id="overlap",
        ),
        pytest.param({"w": [1, 2]}, 0, "tensor 'w': expected an object, got list", id="entry"),
    ],
)
def test_safetensors_header_is_checked(
    tmp_path: Path, header: dict[str, object], data_bytes: int, expected: str
) -> None:
    path = safetensors_file(tmp_path, header, data_bytes)
    message, _ = one_line_error(estimate_model, tmp_path)
    assert message.startswith(str(path))
    assert expected in message


def test_safetensors_length_cannot_exceed_the_file(tmp_path: Path) -> None:
    write_safetensors_model(tmp_path, shards=1)
    (shard,) = tmp_path.glob("*.safetensors")
    crafted = patched(shard, 0, "<Q", 2**40)
    shard.unlink()
    message, _ = one_line_error(read_safetensors_header, crafted)
    assert "safetensors header claims 1,099,511,627,776 bytes but only" in message


def test_sound_safetensors_still_read(tmp_path: Path) -> None:
    written = write_safetensors_model(tmp_path, shards=2, extra_bytes=64)
    assert estimate_model(tmp_path).weights_bytes == written


# --- config.json -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('"num_hidden_layers": NaN', "NaN is not a JSON number", id="nan"),
        pytest.param('"hidden_size": Infinity', "Infinity is not a JSON number", id="inf"),
        pytest.param('"hidden_size": 1e400', "number 1e400 is out of range", id="overflow"),
        pytest.param('"vocab_size": 1' + "0" * 5000, "not a readable JSON config", id="digits"),
        pytest.param(
            '"num_hidden_layers": 1000000000',
            "num_hidden_layers is 1,000,000,000, outside 0..10,000",
            id="layers",
        ),
        pytest.param(
            '"num_hidden_layers": "two"', "num_hidden_layers is 'two', expected a whole", id="str"
        ),
        pytest.param(
            '"num_hidden_layers": [2]', "num_hidden_layers is [2], expected a whole", id="list"
        ),
        pytest.param('"num_hidden_layers": 2.5', "num_hidden_layers is 2.5", id="fraction"),
        pytest.param('"num_hidden_layers": -2', "num_hidden_layers is -2, outside", id="negative"),
        pytest.param('"num_key_value_heads": 1e300', "num_key_value_heads is 1", id="huge-opt"),
        pytest.param('"quantization_config": [4]', "quantization_config is [4]", id="quant"),
        pytest.param('"nested": ' + "[" * 100_000 + "]" * 100_000, "nested too deeply", id="deep"),
    ],
)
def test_config_numbers_and_types_are_checked(tmp_path: Path, text: str, expected: str) -> None:
    body = json.dumps(TINY_CONFIG)[:-1] + ", " + text + "}"
    (tmp_path / "config.json").write_text(body)
    message, elapsed = one_line_error(estimate_model, tmp_path)
    assert expected in message
    assert elapsed < 1.0


def test_oversized_config_is_not_read_whole(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(" " * (5 * 1024 * 1024) + "{}")
    message, _ = one_line_error(load_shape, tmp_path)
    assert "larger than 4,194,304 bytes" in message


def test_errors_stay_in_the_estimator_family(tmp_path: Path) -> None:
    """UnsupportedModel is what callers turn into a 400 / exit 2."""
    (tmp_path / "config.json").write_text('{"hidden_size": NaN}')
    with pytest.raises(UnsupportedModel):
        load_shape(tmp_path)


def test_a_checkpoint_of_too_many_tensors_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard is bounded on its own; so is their sum (a directory of many shards)."""
    monkeypatch.setattr(checkpoint, "MAX_CHECKPOINT_TENSORS", 10)
    write_safetensors_model(tmp_path, shards=3)
    message, _ = one_line_error(load_shape, tmp_path)
    assert f"{tmp_path}: over 10 tensors in its safetensors files" in message


def test_numbers_in_range_that_describe_no_model_are_refused(tmp_path: Path) -> None:
    """Each size ≤ 2^40 passes alone; an estimate of 2^86 bytes would overflow the store."""
    huge = {key: 2**40 for key in ("hidden_size", "intermediate_size", "vocab_size")}
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG | huge))
    message, _ = one_line_error(estimate_model, tmp_path)
    assert "more than any device holds" in message
