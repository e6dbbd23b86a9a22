"""KV bytes per token (exact, per issue 3) and the KV buffers engines allocate."""

from __future__ import annotations

import pytest

from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.kv import (
    kv_bytes_for_tokens,
    kv_bytes_per_token,
    kv_dtype_bytes,
    llamacpp_kv_bytes,
)
from tests.estimate.conftest import shape_of


@pytest.mark.parametrize(
    ("name", "tp", "kv_dtype", "expected"),
    [
        pytest.param("llama-3.1-8b-instruct", 1, "auto", 131072, id="llama-8b"),
        pytest.param("llama-3.1-8b-instruct", 1, "fp8", 65536, id="llama-8b-fp8-halves"),
        pytest.param("llama-3.1-8b-instruct", 2, "auto", 65536, id="llama-8b-tp2"),
        pytest.param("llama-3.1-70b-instruct", 16, "auto", 40960, id="kv-heads-replicated"),
        pytest.param("llama-3.2-3b-instruct", 1, "auto", 114688, id="llama-3b"),
        pytest.param("qwen2.5-7b-instruct", 1, "auto", 57344, id="qwen2.5-7b"),
        pytest.param("qwen3-0.6b", 1, "auto", 114688, id="qwen3-0.6b"),
        pytest.param("mistral-small-3.2-24b-instruct", 1, "auto", 163840, id="mistral-small"),
        pytest.param("gemma-2-9b-it", 1, "auto", 344064, id="gemma2-sliding-counts"),
        pytest.param("gpt-oss-20b", 1, "auto", 49152, id="gpt-oss-hybrid"),
        pytest.param("qwen3-30b-a3b", 1, "auto", 98304, id="qwen3-moe"),
        pytest.param("deepseek-v3", 1, "auto", 70272, id="mla"),
        pytest.param("deepseek-v3", 8, "auto", 70272, id="mla-not-sharded"),
        pytest.param("deepseek-v2.5", 8, "auto", 69120, id="mla-v2.5"),
        pytest.param("qwen3-next-80b-a3b", 1, "auto", 24576, id="linear-layers-no-kv"),
    ],
)
def test_kv_bytes_per_token(name: str, tp: int, kv_dtype: str, expected: int) -> None:
    per_token = kv_bytes_per_token(
        shape_of(name), dtype_bytes=kv_dtype_bytes(kv_dtype, 2), tensor_parallel=tp
    )
    assert per_token == expected


def test_pipeline_stage_holds_its_layers() -> None:
    shape = shape_of("deepseek-v2.5")
    assert kv_bytes_per_token(shape, dtype_bytes=2, pipeline_parallel=2) == 30 * 1152


def test_whole_blocks() -> None:
    assert kv_bytes_for_tokens(131072, 16000) == 1000 * 16 * 131072
    assert kv_bytes_for_tokens(100, 17) == 32 * 100


@pytest.mark.parametrize(
    ("name", "n_ctx", "type_kv", "expected_mib"),
    [
        pytest.param("llama-3-8b", 512, "f16", 64.0, id="llama3-8b-512"),
        pytest.param("trilm-3.9b", 512, "f16", 180.0, id="trilm-mha"),
        pytest.param("llama-3-8b", 8192, "q8_0", 8192 * 32 * 2048 * 34 / 32 / 2**20, id="q8-cache"),
        pytest.param("llama-3-8b", 500, "f16", 64.0, id="ctx-padded-to-256"),
    ],
)
def test_llamacpp_kv_buffer(name: str, n_ctx: int, type_kv: str, expected_mib: float) -> None:
    kv = llamacpp_kv_bytes(shape_of(name), n_ctx=n_ctx, type_k=type_kv, type_v=type_kv)
    assert kv / 2**20 == pytest.approx(expected_mib)


def test_llamacpp_sliding_layers_keep_a_window() -> None:
    shape = shape_of("gemma-2-9b-it")
    full = llamacpp_kv_bytes(shape, n_ctx=8192, swa_full=True)
    windowed = llamacpp_kv_bytes(shape, n_ctx=8192)
    assert windowed < full


def test_unknown_kv_dtype() -> None:
    with pytest.raises(InvalidSetting, match="int3"):
        kv_dtype_bytes("int3", 2)
