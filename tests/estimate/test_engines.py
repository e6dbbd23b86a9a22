"""The engine models: which vLLM engine a version means, the scheduler limits and dummy images
its profile run uses, vision-tower and cross-attention profiling, and the per-sequence state
of hybrid (Mamba / linear-attention) models. Numbers are worked from vLLM's source and the
logs in shared/data."""

from __future__ import annotations

import pytest

from cohabit.estimate import estimate_shape
from cohabit.estimate.engines import (
    VLLM_V0,
    VLLM_V1,
    vision_activation_bytes,
    vllm_generation,
    vllm_profile_images,
    vllm_scheduler,
)
from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.kv import linear_state_bytes, vllm_sequence_kv_bytes
from cohabit.estimate.settings import EngineSettings
from cohabit.estimate.shape import FULL, LINEAR, shape_from_config
from cohabit.units import GIB
from tests.estimate.conftest import shape_of

H100_GIB = 79.22


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        pytest.param(None, VLLM_V1, id="none-is-today"),
        pytest.param("0.5.3 (Jul 2024)", VLLM_V0, id="0.5.3"),
        pytest.param("~0.6.6 main (V0)", VLLM_V0, id="0.6.6-marked"),
        pytest.param("~0.8.x (V0 log format)", VLLM_V0, id="0.8-marked-v0"),
        pytest.param("0.8.3", VLLM_V1, id="0.8.3-default-v1"),
        pytest.param("v0.11.0 (V1 engine, vllm/vllm-openai:v0.11.0 image)", VLLM_V1, id="v0.11"),
        pytest.param("v0.7.3", VLLM_V0, id="v-prefixed-0.7"),
        pytest.param("V1", VLLM_V1, id="mark-v1"),
        pytest.param("v0", VLLM_V0, id="mark-v0"),
    ],
)
def test_vllm_generation(text: str | None, engine: str) -> None:
    assert vllm_generation(text) == engine


def test_vllm_generation_rejects_nonsense() -> None:
    with pytest.raises(InvalidSetting, match="engine version"):
        vllm_generation("latest")


@pytest.mark.parametrize(
    ("generation", "max_model_len", "multimodal", "seqs", "tokens"),
    [
        pytest.param(VLLM_V0, 29000, False, 256, 29000, id="v0-whole-prompt"),
        pytest.param(VLLM_V0, 1024, False, 256, 2048, id="v0-at-least-2048"),
        pytest.param(VLLM_V0, 65536, False, 256, 2048, id="v0-long-text-chunked"),
        pytest.param(VLLM_V0, 65536, True, 256, 65536, id="v0-long-multimodal-not-chunked"),
        pytest.param(VLLM_V1, 65536, False, 1024, 8192, id="v1-h100"),
    ],
)
def test_vllm_scheduler_defaults_by_engine(
    generation: str, max_model_len: int, multimodal: bool, seqs: int, tokens: int
) -> None:
    scheduler, used_default = vllm_scheduler(
        max_num_batched_tokens=None,
        max_num_seqs=None,
        device_total_bytes=int(H100_GIB * GIB),
        device_name="NVIDIA H100 80GB HBM3",
        generation=generation,
        max_model_len=max_model_len,
        multimodal=multimodal,
    )
    assert used_default
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (seqs, tokens)


def test_a100_named_without_memory_gets_small_defaults() -> None:
    scheduler, _ = vllm_scheduler(
        max_num_batched_tokens=None,
        max_num_seqs=None,
        device_total_bytes=None,
        device_name="NVIDIA A100-SXM4-80GB",
    )
    assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (256, 2048)


@pytest.mark.parametrize(
    ("name", "generation", "seqs", "tokens", "images"),
    [
        # Pixtral tower: 1540 px / 14 = 110² patches, merged 2×2 → 3,025 tokens per image
        pytest.param("mistral-small-3.2-24b-instruct", VLLM_V1, 1024, 8192, 3, id="v1-budget"),
        pytest.param("mistral-small-3.2-24b-instruct", VLLM_V1, 2, 8192, 2, id="v1-seqs-cap"),
        pytest.param("mistral-small-3.2-24b-instruct", VLLM_V1, 256, 2048, 1, id="v1-one-image"),
        pytest.param("mistral-small-3.2-24b-instruct", VLLM_V0, 256, 16000, 5, id="v0-fits-batch"),
        # mllama (encoder-decoder): every dummy sequence carries an image
        pytest.param("llama-3.2-11b-vision", VLLM_V0, 128, 65536, 128, id="v0-mllama"),
        pytest.param("llama-3.2-11b-vision", VLLM_V1, 128, 8192, 2, id="v1-mllama"),
    ],
)
def test_profile_images(name: str, generation: str, seqs: int, tokens: int, images: int) -> None:
    scheduler, _ = vllm_scheduler(
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        device_total_bytes=None,
        device_name=None,
        generation=generation,
    )
    assert vllm_profile_images(shape_of(name), scheduler=scheduler) == images


def test_mllama_v0_profile_covers_the_logged_activation_peak() -> None:
    """vllm#12126: Llama-3.2-11B-Vision, V0, --max-num-seqs 128 --max-model-len 65536 on an
    H100 logged a 36.63 GiB activation peak (128 images × 4 tiles through the tower)."""
    shape = shape_of("llama-3.2-11b-vision")
    scheduler, _ = vllm_scheduler(
        max_num_batched_tokens=None,
        max_num_seqs=128,
        device_total_bytes=int(H100_GIB * GIB),
        device_name="NVIDIA H100 80GB HBM3",
        generation=VLLM_V0,
        max_model_len=65536,
        multimodal=True,
    )
    vision = vision_activation_bytes(shape, scheduler=scheduler, act_bytes=2)
    assert 36.63 * GIB <= vision <= 36.63 * GIB * 1.15
    # the tower grows with the dummy sequences: 16 of them need an eighth
    fewer, _ = vllm_scheduler(
        max_num_batched_tokens=None,
        max_num_seqs=16,
        device_total_bytes=None,
        device_name=None,
        generation=VLLM_V0,
        max_model_len=65536,
        multimodal=True,
    )
    assert vision_activation_bytes(shape, scheduler=fewer, act_bytes=2) < vision / 4


def test_linear_state_of_qwen3_next() -> None:
    shape = shape_of("qwen3-next-80b-a3b")
    assert shape.linear_state is not None
    assert (shape.linear_state.conv_elements, shape.linear_state.ssm_elements) == (24576, 524288)
    assert (shape.attention_layers, shape.linear_layers) == (12, 36)
    assert linear_state_bytes(shape, act_bytes=2) == 24576 * 2 + 524288 * 4
    assert linear_state_bytes(shape, act_bytes=2, tensor_parallel=4) == 6144 * 2 + 131072 * 4


def test_hybrid_sequence_holds_attention_kv_and_padded_states() -> None:
    """vLLM V1 grows the attention block so one page holds a state: 2,048 bytes per token and
    layer, state 2,146,304 bytes → 1,056-token blocks; each of the 36 states pads to a page."""
    shape = shape_of("qwen3-next-80b-a3b")
    per_token = 12 * 2048
    kv = vllm_sequence_kv_bytes(shape, per_token_bytes=per_token, tokens=4096, act_bytes=2)
    assert kv == 4 * 1056 * per_token + 36 * 1056 * 2048
    est = estimate_shape(shape, settings=EngineSettings(max_model_len=4096))
    assert est.kv_cache_bytes == kv
    assert est.kv_cache_bytes > 4096 * est.kv_cache_bytes_per_token


def test_llamacpp_counts_recurrent_state_per_sequence() -> None:
    shape = shape_of("qwen3-next-80b-a3b")
    one = estimate_shape(shape, engine="llamacpp", settings=EngineSettings(max_model_len=4096))
    two = estimate_shape(
        shape, engine="llamacpp", settings=EngineSettings(max_model_len=2048, concurrency=2)
    )
    state = 4 * (24576 + 524288)
    assert two.kv_cache_bytes - one.kv_cache_bytes == 36 * state


@pytest.mark.parametrize(
    ("extra", "kinds", "conv", "ssm"),
    [
        pytest.param(
            # Jamba: attention every 8th layer from 4, Mamba1 with 2 × hidden channels
            {
                "attn_layer_period": 8,
                "attn_layer_offset": 4,
                "mamba_d_state": 16,
                "mamba_d_conv": 4,
                "mamba_expand": 2,
            },
            (LINEAR,) * 4 + (FULL,) + (LINEAR,) * 3,
            3 * 8192,
            8192 * 16,
            id="jamba-mamba1",
        ),
        pytest.param(
            # Mamba2 heads (Granite-4 / Nemotron-H style keys) with declared layer types
            {
                "layer_types": ["mamba"] * 7 + ["attention"],
                "mamba_n_heads": 128,
                "mamba_d_head": 64,
                "mamba_d_state": 128,
                "mamba_n_groups": 1,
                "mamba_d_conv": 4,
            },
            (LINEAR,) * 7 + (FULL,),
            3 * (8192 + 2 * 128),
            8192 * 128,
            id="mamba2-heads",
        ),
    ],
)
def test_hybrid_configs(
    extra: dict[str, object], kinds: tuple[str, ...], conv: int, ssm: int
) -> None:
    cfg = {
        "architectures": ["HybridForCausalLM"],
        "model_type": "hybrid",
        "hidden_size": 4096,
        "num_hidden_layers": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 65536,
        **extra,
    }
    shape = shape_from_config(cfg, name="hybrid")
    assert shape.kinds == kinds
    assert shape.linear_state is not None
    assert (shape.linear_state.conv_elements, shape.linear_state.ssm_elements) == (conv, ssm)
