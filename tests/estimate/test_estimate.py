"""Whole estimates: totals against what engines needed, sources, settings the engines refuse,
and invariants that must hold for any setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cohabit.estimate import Estimate, estimate_shape
from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.estimate import Source
from cohabit.estimate.settings import EngineSettings
from cohabit.units import GIB, MIB
from tests.estimate.conftest import shape_of

H100 = {"device_total_bytes": int(79.18 * GIB), "device_name": "NVIDIA H100 80GB HBM3"}


def _estimate(name: str, kwargs: dict[str, object]) -> Estimate:
    """A table row's keywords: the estimate's context (engine, device) and the settings."""
    context = {k: v for k, v in kwargs.items() if k in _CONTEXT}
    settings = EngineSettings(**{k: v for k, v in kwargs.items() if k not in _CONTEXT})  # type: ignore[arg-type]
    return estimate_shape(shape_of(name), settings=settings, **context)  # type: ignore[arg-type]


_CONTEXT = ("engine", "device_total_bytes", "device_name", "engine_version")


@pytest.mark.parametrize(
    ("name", "kwargs", "needed_gib"),
    [
        # weights + activation + non-torch + KV for one full sequence, from vLLM's own logs
        pytest.param(
            "llama-3.1-8b-instruct",
            {"max_model_len": 16000, **H100},
            14.99 + 4.76 + 0.13 + 16000 * 131072 / GIB,
            id="llama-8b-h100",
        ),
        pytest.param(
            "qwen3-0.6b",
            {"max_model_len": 16000, **H100},
            1.12 + 5.56 + 0.13 + 16000 * 114688 / GIB,
            id="qwen3-0.6b-h100",
        ),
        pytest.param(
            "qwen3-32b",
            {"max_model_len": 16000, "tensor_parallel": 2, **H100},
            30.59 + 5.64 + 0.54 + 16000 * 131072 / GIB,
            id="qwen3-32b-tp2",
        ),
        pytest.param(
            "gpt-oss-120b",
            {"max_model_len": 16000, **H100},
            64.38 + 7.38 + 0.13 + 16000 * 73728 / GIB,
            id="gpt-oss-120b",
        ),
        pytest.param(
            "llama-3.1-8b-instruct",
            {
                "max_model_len": 29000,
                "max_num_batched_tokens": 29000,
                "device_total_bytes": int(23.58 * GIB),
                "device_name": "NVIDIA GeForce RTX 3090",
            },
            14.9888 + 2.99 + 0.35 + 29000 * 131072 / GIB,
            id="llama-8b-29k-batch",
        ),
        pytest.param(
            # vllm#12126: V0 profiled 128 dummy images (36.63 GiB of activation)
            "llama-3.2-11b-vision",
            {
                "max_model_len": 65536,
                "max_num_seqs": 128,
                "enforce_eager": True,
                "engine_version": "~0.6.6 main (V0)",
                "device_total_bytes": int(79.22 * GIB),
                "device_name": "NVIDIA H100 80GB HBM3",
            },
            19.86 + 36.63 + 0.16 + 65536 * 163830 / GIB,
            id="mllama-v0-128-images",
        ),
    ],
)
def test_vllm_total_covers_what_vllm_needed(
    name: str, kwargs: dict[str, object], needed_gib: float
) -> None:
    total_gib = _estimate(name, kwargs).total_bytes / GIB
    assert needed_gib <= total_gib <= needed_gib * 1.15


def test_llamacpp_total_covers_printed_buffers() -> None:
    # Llama-3-8B Q4_K_M, n_ctx 512: model 4403.49 + KV 64 + compute 258.5 MiB on the GPU.
    est = estimate_shape(
        shape_of("llama-3-8b"),
        engine="llamacpp",
        settings=EngineSettings(quantization="Q4_K_M", max_model_len=512),
    )
    needed = (4403.49 + 64 + 258.5) * MIB
    assert needed <= est.total_bytes <= needed * 1.15


def test_parts_add_up_and_sources_are_named() -> None:
    est = estimate_shape(
        shape_of("llama-3.1-8b-instruct"), settings=EngineSettings(max_model_len=8192)
    )
    parts = est.weights_bytes + est.kv_cache_bytes + est.activation_bytes + est.overhead_bytes
    assert est.total_bytes == parts
    assert est.overhead_bytes == sum(est.overhead_parts.values())
    assert est.sources["weights_bytes"] is Source.DERIVED
    assert est.sources["activation_bytes"] is Source.DEFAULT  # no device: vLLM defaults assumed
    assert set(est.to_dict()) >= {
        "weights_bytes",
        "kv_cache_bytes_per_token",
        "kv_cache_bytes",
        "activation_bytes",
        "overhead_bytes",
        "total_bytes",
        "tensor_parallel",
        "sources",
    }


@pytest.mark.parametrize(
    ("device_name", "device_gib", "seqs", "tokens"),
    [
        pytest.param("NVIDIA H100 80GB HBM3", 79.2, 1024, 8192, id="h100-large"),
        pytest.param("NVIDIA A100-SXM4-80GB", 79.2, 256, 2048, id="a100-small"),
        pytest.param("NVIDIA L4", 22.0, 256, 2048, id="l4-small"),
        pytest.param(None, None, 1024, 8192, id="unknown-assumes-large"),
    ],
)
def test_vllm_scheduler_defaults(
    device_name: str | None, device_gib: float | None, seqs: int, tokens: int
) -> None:
    est = estimate_shape(
        shape_of("qwen3-0.6b"),
        device_name=device_name,
        device_total_bytes=None if device_gib is None else int(device_gib * GIB),
    )
    assert (est.max_num_seqs, est.max_num_batched_tokens) == (seqs, tokens)


def test_enforce_eager_drops_cuda_graphs() -> None:
    shape = shape_of("llama-3.1-8b-instruct")
    assert (
        estimate_shape(shape, settings=EngineSettings(enforce_eager=True)).overhead_parts[
            "cuda_graphs"
        ]
        == 0
    )
    assert estimate_shape(shape).overhead_parts["cuda_graphs"] > 0


def test_non_torch_grows_with_tensor_parallel() -> None:
    shape = shape_of("llama-3.1-70b-instruct")
    parts = [
        estimate_shape(shape, settings=EngineSettings(tensor_parallel=tp)).overhead_parts[
            "non_torch"
        ]
        for tp in (1, 2, 8)
    ]
    assert parts == sorted(parts) and parts[0] < parts[1]


def test_fp8_kv_cache_halves_the_cache() -> None:
    shape = shape_of("llama-3.1-8b-instruct")
    auto = estimate_shape(shape, settings=EngineSettings(max_model_len=8192))
    fp8 = estimate_shape(shape, settings=EngineSettings(max_model_len=8192, kv_cache_dtype="fp8"))
    assert fp8.kv_cache_bytes * 2 == auto.kv_cache_bytes


def test_mlx_unified_memory_estimate() -> None:
    est = estimate_shape(
        shape_of("llama-3.1-8b-instruct-mlx-4bit"),
        engine="mlx",
        settings=EngineSettings(max_model_len=8192),
    )
    assert est.kv_cache_bytes == 8192 * 131072
    assert 4.5 * GIB < est.weights_bytes < 5.0 * GIB + 1.05e9


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        pytest.param(
            "llama-3.1-8b-instruct", {"tensor_parallel": 3}, "does not divide", id="tp-heads"
        ),
        pytest.param("phi-4", {"tensor_parallel": 4}, "KV heads", id="tp-kv-heads"),
        pytest.param("llama-3.1-8b-instruct", {"tensor_parallel": 0}, "at least 1", id="tp-zero"),
        pytest.param("llama-3-8b", {"max_model_len": 9000}, "exceeds", id="too-long"),
        pytest.param("llama-3-8b", {"max_model_len": 0}, "at least 1", id="zero-length"),
        pytest.param("llama-3-8b", {"engine": "tgi"}, "unknown engine", id="engine"),
        pytest.param("llama-3-8b", {"dtype": "int4"}, "unknown dtype", id="dtype"),
        pytest.param("llama-3-8b", {"quantization": "hqq"}, "unknown quantization", id="quant"),
        pytest.param("llama-3-8b", {"quantization": "awq"}, "needs a checkpoint", id="awq-on-bf16"),
        pytest.param(
            "llama-3.1-8b-instruct-awq", {"quantization": "none"}, "awq-quantized", id="dequantize"
        ),
        pytest.param(
            "llama-3-8b", {"engine": "mlx", "tensor_parallel": 2}, "vllm only", id="mlx-tp"
        ),
        pytest.param(
            "llama-3.1-8b-instruct-awq", {"engine": "llamacpp"}, "GGUF", id="llamacpp-needs-gguf"
        ),
    ],
)
def test_settings_the_engine_refuses(name: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSetting, match=message):
        _estimate(name, kwargs)


@settings(max_examples=40, deadline=None)
@given(
    length=st.integers(min_value=1, max_value=131072),
    seqs=st.integers(min_value=1, max_value=1024),
    concurrency=st.integers(min_value=1, max_value=8),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_total_always_holds_the_requested_sequences(
    length: int, seqs: int, concurrency: int, tp: int
) -> None:
    est = estimate_shape(
        shape_of("llama-3.1-8b-instruct"),
        settings=EngineSettings(
            max_model_len=length, max_num_seqs=seqs, concurrency=concurrency, tensor_parallel=tp
        ),
    )
    assert est.kv_cache_bytes >= concurrency * length * est.kv_cache_bytes_per_token
    assert est.total_bytes >= est.weights_bytes + est.kv_cache_bytes + est.activation_bytes
    longer = estimate_shape(
        shape_of("llama-3.1-8b-instruct"),
        settings=EngineSettings(
            max_model_len=min(131072, length + 16),
            max_num_seqs=seqs,
            concurrency=concurrency,
            tensor_parallel=tp,
        ),
    )
    assert longer.total_bytes >= est.total_bytes


_ALL_CONFIGS = sorted(
    path.stem
    for path in (Path(__file__).parents[1] / "fixtures" / "estimate" / "configs").glob("*.json")
    if path.stem != "no-layers"
)


@pytest.mark.parametrize("name", _ALL_CONFIGS)
@pytest.mark.parametrize("engine_version", ["0.6.6", None])
def test_every_model_holds_one_full_sequence(name: str, engine_version: str | None) -> None:
    shape = shape_of(name)
    length = min(shape.max_model_len, 32768)
    est = estimate_shape(
        shape, engine_version=engine_version, settings=EngineSettings(max_model_len=length)
    )
    assert est.kv_cache_bytes >= length * est.kv_cache_bytes_per_token
    assert est.total_bytes >= est.weights_bytes + est.kv_cache_bytes + est.activation_bytes
    assert est.activation_bytes > 0 and est.overhead_bytes > 0
