"""Exact bytes from files the suite writes: safetensors headers, an index's total, GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cohabit.estimate import estimate_model
from cohabit.estimate.checkpoint import load_shape, read_safetensors_header, shape_from_gguf
from cohabit.estimate.errors import ModelNotFound, UnsupportedModel
from cohabit.estimate.estimate import Source
from cohabit.estimate.settings import EngineSettings
from tests.estimate.tinymodels import (
    LAYERS,
    TINY_CONFIG,
    write_gguf_model,
    write_index_only_model,
    write_safetensors_model,
)


def test_header_is_read_without_the_data(tmp_path: Path) -> None:
    written = write_safetensors_model(tmp_path / "m", shards=1)
    (file,) = (tmp_path / "m").glob("*.safetensors")
    tensors = read_safetensors_header(file)
    assert sum(t.nbytes for t in tensors) == written
    assert {t.dtype for t in tensors} == {"F16"}


@pytest.mark.parametrize("shards", [1, 3], ids=["one-file", "three-shards"])
def test_directory_uses_exact_header_bytes(tmp_path: Path, shards: int) -> None:
    written = write_safetensors_model(tmp_path / "m", shards=shards, extra_bytes=4096)
    estimate = estimate_model(tmp_path / "m")
    assert estimate.sources["weights_bytes"] is Source.EXACT
    assert estimate.weights_bytes == written


def test_config_path_finds_its_shards(tmp_path: Path) -> None:
    written = write_safetensors_model(tmp_path / "m")
    assert estimate_model(tmp_path / "m" / "config.json").weights_bytes == written


def test_fp32_checkpoint_is_served_in_bf16(tmp_path: Path) -> None:
    written = write_safetensors_model(tmp_path / "m", dtype=np.float32)
    estimate = estimate_model(tmp_path / "m")
    assert estimate.dtype == "bfloat16"
    assert estimate.weights_bytes == written // 2


def test_index_total_size_when_shards_are_absent(tmp_path: Path) -> None:
    write_index_only_model(tmp_path / "m", total_size=300_000)
    estimate = estimate_model(tmp_path / "m")
    assert estimate.sources["weights_bytes"] is Source.EXACT
    assert estimate.weights_bytes == 300_000


def test_config_only_is_derived(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    assert estimate_model(tmp_path).sources["weights_bytes"] is Source.DERIVED


@pytest.mark.parametrize("tied", [False, True], ids=["output-layer", "tied"])
def test_gguf_metadata_and_tensor_bytes(tmp_path: Path, tied: bool) -> None:
    places = write_gguf_model(tmp_path / "m.gguf", tied=tied)
    shape = load_shape(tmp_path / "m.gguf")
    assert (shape.num_layers, shape.num_kv_heads, shape.vocab_size) == (LAYERS, 2, 256)
    assert shape.tie_word_embeddings is tied
    assert shape.quant.gguf_type == "F16"
    estimate = estimate_model(
        tmp_path / "m.gguf", engine="llamacpp", settings=EngineSettings(max_model_len=256)
    )
    assert estimate.sources["weights_bytes"] is Source.EXACT
    # token_embd stays on the host; layers and the output layer are offloaded.
    assert estimate.host_bytes == places["token_embd"]
    assert estimate.weights_bytes == places["layers"] + places["output"]


def test_gguf_partial_offload(tmp_path: Path) -> None:
    write_gguf_model(tmp_path / "m.gguf")
    full = estimate_model(
        tmp_path / "m.gguf", engine="llamacpp", settings=EngineSettings(max_model_len=256)
    )
    one = estimate_model(
        tmp_path / "m.gguf",
        engine="llamacpp",
        settings=EngineSettings(max_model_len=256, n_gpu_layers=1),
    )
    assert one.weights_bytes < full.weights_bytes
    assert one.kv_cache_bytes == full.kv_cache_bytes // 2
    assert one.host_bytes + one.weights_bytes == full.host_bytes + full.weights_bytes


def test_directory_with_one_gguf(tmp_path: Path) -> None:
    write_gguf_model(tmp_path / "m.gguf")
    assert load_shape(tmp_path).architecture == "llama"


@pytest.mark.parametrize(
    ("content", "error"),
    [
        pytest.param(b"\x01", UnsupportedModel, id="too-short"),
        pytest.param(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope", UnsupportedModel, id="bad-json"),
    ],
)
def test_broken_safetensors(tmp_path: Path, content: bytes, error: type[Exception]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(error):
        load_shape(tmp_path)


@pytest.mark.parametrize(
    "source",
    ["/no/such/dir", "no-such-file.json", "./relative/thing"],
    ids=["abs-path", "json-name", "relative"],
)
def test_missing_sources(source: str) -> None:
    with pytest.raises(ModelNotFound):
        load_shape(source)


def test_broken_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UnsupportedModel, match="not a readable JSON"):
        load_shape(tmp_path)


@pytest.mark.parametrize("keep_bytes", [40, 200, 1000, 5000, -1], ids=lambda n: f"first-{n}-bytes")
def test_damaged_gguf_is_one_unsupported_model_error(tmp_path: Path, keep_bytes: int) -> None:
    """A truncated GGUF fails inside the gguf reader in several ways (IndexError, ValueError);
    each is reported as the same user problem, never as a crash."""
    from cohabit.runtime.tinymodel import write_tiny_model

    whole = tmp_path / "whole.gguf"
    write_tiny_model(whole)
    data = whole.read_bytes()
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(data[: keep_bytes if keep_bytes > 0 else len(data) // 2])
    with pytest.raises(UnsupportedModel, match="not a readable GGUF file"):
        shape_from_gguf(damaged)
