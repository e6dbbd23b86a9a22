"""Reading config.json into a ModelShape, one row per architecture family and quantization."""

from __future__ import annotations

import pytest

from cohabit.estimate.errors import UnsupportedModel
from cohabit.estimate.shape import FULL, LINEAR, SLIDING, quant_from_config, shape_from_config
from tests.estimate.conftest import shape_of


@pytest.mark.parametrize(
    ("name", "layers", "heads", "kv_heads", "head_dim", "tied", "max_len"),
    [
        pytest.param("llama-3.1-8b-instruct", 32, 32, 8, 128, False, 131072, id="dense-gqa"),
        pytest.param("llama-3.2-3b-instruct", 28, 24, 8, 128, True, 131072, id="tied"),
        pytest.param("qwen2.5-7b-instruct", 28, 28, 4, 128, False, 32768, id="qwen-bias"),
        pytest.param("gemma-2-9b-it", 42, 16, 8, 256, True, 8192, id="gemma2-tied-default"),
        pytest.param("gpt-oss-20b", 24, 64, 8, 64, False, 131072, id="yarn-length"),
        pytest.param("deepseek-v2.5", 60, 128, 128, 40, False, 163840, id="mla"),
        pytest.param("mistral-small-3.2-24b-instruct", 40, 32, 8, 128, False, 131072, id="vlm"),
    ],
)
def test_attention_numbers(
    name: str, layers: int, heads: int, kv_heads: int, head_dim: int, tied: bool, max_len: int
) -> None:
    shape = shape_of(name)
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads) == (layers, heads, kv_heads)
    assert shape.head_dim == head_dim
    assert shape.tie_word_embeddings is tied
    assert shape.max_model_len == max_len


def test_qwen2_carries_qkv_bias_without_declaring_it() -> None:
    assert shape_of("qwen2.5-7b-instruct").qkv_bias
    assert not shape_of("llama-3.1-8b-instruct").qkv_bias


@pytest.mark.parametrize(
    ("name", "experts", "top_k", "width", "shared", "dense"),
    [
        pytest.param("mixtral-8x7b-v0.1", 8, 2, 14336, 0, 0, id="mixtral"),
        pytest.param("qwen3-30b-a3b", 128, 8, 768, 0, 0, id="qwen3-moe"),
        pytest.param("gpt-oss-20b", 32, 4, 2880, 0, 0, id="gpt-oss"),
        pytest.param("deepseek-v3", 256, 8, 2048, 2048, 3, id="deepseek-v3"),
        pytest.param("qwen3-next-80b-a3b", 512, 10, 512, 512, 0, id="qwen3-next"),
    ],
)
def test_moe(name: str, experts: int, top_k: int, width: int, shared: int, dense: int) -> None:
    moe = shape_of(name).moe
    assert moe is not None
    assert (moe.num_experts, moe.experts_per_token) == (experts, top_k)
    assert (moe.expert_intermediate_size, moe.shared_intermediate_size) == (width, shared)
    assert moe.dense_layers == dense


def test_mla_ranks() -> None:
    mla = shape_of("deepseek-v3").mla
    assert mla is not None
    assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.q_lora_rank) == (512, 64, 1536)


@pytest.mark.parametrize(
    ("name", "first_kinds", "attention_layers"),
    [
        pytest.param("gemma-2-9b-it", (SLIDING, FULL, SLIDING), 42, id="gemma2-alternating"),
        pytest.param("gpt-oss-20b", (SLIDING, FULL, SLIDING), 24, id="layer-types"),
        pytest.param("qwen3-next-80b-a3b", (LINEAR, LINEAR, LINEAR, FULL), 12, id="hybrid-linear"),
        pytest.param("qwen2.5-7b-instruct", (FULL, FULL), 28, id="window-disabled"),
    ],
)
def test_layer_kinds(name: str, first_kinds: tuple[str, ...], attention_layers: int) -> None:
    shape = shape_of(name)
    assert shape.kinds[: len(first_kinds)] == first_kinds
    assert shape.attention_layers == attention_layers


def test_vision_tower_from_vision_config() -> None:
    vision = shape_of("mistral-small-3.2-24b-instruct").vision
    assert vision is not None
    assert (vision.hidden_size, vision.num_layers, vision.spatial_merge_size) == (1024, 24, 2)
    mllama = shape_of("llama-3.2-11b-vision").vision
    assert mllama is not None
    assert (mllama.num_layers, mllama.num_tiles) == (40, 4)


@pytest.mark.parametrize(
    ("name", "method", "bits", "group"),
    [
        pytest.param("llama-3.1-8b-instruct-awq", "awq", 4, 128, id="awq"),
        pytest.param("llama-3.1-8b-instruct-gptq", "gptq", 4, 128, id="gptq"),
        pytest.param("llama-3.3-70b-instruct-fp8-dynamic", "fp8", 8, 0, id="compressed-tensors"),
        pytest.param("llama-3.1-405b-instruct-fp8", "fp8", 8, 0, id="fbgemm-fp8"),
        pytest.param("deepseek-v3", "fp8", 8, 0, id="fp8-block"),
        pytest.param("llama-3.1-8b-instruct-bnb-4bit", "bitsandbytes", 4, 64, id="bnb"),
        pytest.param("gpt-oss-20b", "mxfp4", 4, 32, id="mxfp4"),
        pytest.param("llama-3.1-8b-instruct-mlx-4bit", "mlx", 4, 64, id="mlx"),
        pytest.param("llama-3.1-8b-instruct", "none", 16, 0, id="none"),
    ],
)
def test_quantization_config(name: str, method: str, bits: int, group: int) -> None:
    quant = shape_of(name).quant
    assert (quant.method, quant.bits, quant.group_size) == (method, bits, group)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param({"hidden_size": 64, "vocab_size": 10}, "num_hidden_layers", id="no-layers"),
        pytest.param(
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
            },
            "vocab_size",
            id="no-vocab",
        ),
        pytest.param(
            {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10},
            "intermediate_size",
            id="no-mlp-width",
        ),
        pytest.param(
            {"hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 4},
            "expected a whole number",
            id="not-a-number",
        ),
    ],
)
def test_missing_numbers_are_unsupported(config: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedModel, match=message):
        shape_from_config(config, name="x")


def test_unknown_quantization_is_unsupported() -> None:
    with pytest.raises(UnsupportedModel, match="hqq"):
        quant_from_config({"quant_method": "hqq"}, where="x")
