"""Budget → engine settings (the launcher's direction)."""

from __future__ import annotations

import pytest

from cohabit.estimate import estimate_shape
from cohabit.estimate.budget import (
    BudgetShortfall,
    LlamacppLaunchSettings,
    VllmLaunchSettings,
    llamacpp_settings_for_budget,
    vllm_settings_for_budget,
)
from cohabit.estimate.errors import InvalidSetting
from cohabit.estimate.settings import EngineSettings
from cohabit.units import GIB
from tests.estimate.conftest import shape_of

H100_BYTES = 80 * GIB


def test_vllm_estimate_total_fits_its_own_budget() -> None:
    est = estimate_shape(
        shape_of("llama-3.1-8b-instruct"), settings=EngineSettings(max_model_len=16000)
    )
    result = vllm_settings_for_budget(
        est, budget_bytes=est.total_bytes, device_total_bytes=H100_BYTES
    )
    assert isinstance(result, VllmLaunchSettings)
    assert result.max_model_len == 16000
    assert result.kv_cache_memory_bytes >= est.kv_cache_bytes
    assert result.gpu_memory_utilization * H100_BYTES <= est.total_bytes


@pytest.mark.parametrize(
    ("budget_gib", "expected_len"),
    [
        pytest.param(40, 16000, id="roomy-keeps-length"),
        pytest.param(21.5, None, id="tight-shortens-length"),
    ],
)
def test_vllm_length_shrinks_to_fit(budget_gib: float, expected_len: int | None) -> None:
    est = estimate_shape(
        shape_of("llama-3.1-8b-instruct"), settings=EngineSettings(max_model_len=16000)
    )
    result = vllm_settings_for_budget(
        est, budget_bytes=int(budget_gib * GIB), device_total_bytes=H100_BYTES
    )
    assert isinstance(result, VllmLaunchSettings)
    if expected_len is None:
        assert 0 < result.max_model_len < 16000 and result.max_model_len % 16 == 0
    else:
        assert result.max_model_len == expected_len


def test_vllm_budget_below_weights_is_a_shortfall() -> None:
    est = estimate_shape(shape_of("llama-3.1-8b-instruct"))
    result = vllm_settings_for_budget(est, budget_bytes=10 * GIB, device_total_bytes=H100_BYTES)
    assert isinstance(result, BudgetShortfall)
    assert result.needed_bytes > result.budget_bytes
    assert "GiB" in result.message


def test_vllm_settings_need_a_vllm_estimate() -> None:
    est = estimate_shape(shape_of("llama-3-8b"), engine="llamacpp")
    with pytest.raises(InvalidSetting):
        vllm_settings_for_budget(est, budget_bytes=GIB, device_total_bytes=H100_BYTES)


@pytest.mark.parametrize(
    ("budget_gib", "layers", "ctx"),
    [
        pytest.param(24, 33, 8192, id="all-layers-full-context"),
        pytest.param(15.5, 33, 4096, id="context-lowered-first"),
        pytest.param(8, None, 2048, id="then-layers-to-host"),
    ],
)
def test_llamacpp_fit(budget_gib: float, layers: int | None, ctx: int) -> None:
    budget = int(budget_gib * GIB)
    result = llamacpp_settings_for_budget(
        shape_of("llama-3-8b"), budget_bytes=budget, ctx_size=8192
    )
    assert isinstance(result, LlamacppLaunchSettings)
    assert result.ctx_size == ctx
    assert result.gpu_bytes <= budget
    if layers is None:
        assert 0 < result.n_gpu_layers < 33
    else:
        assert result.n_gpu_layers == layers


def test_llamacpp_tiny_budget_is_a_shortfall() -> None:
    result = llamacpp_settings_for_budget(
        shape_of("llama-3-8b"), budget_bytes=GIB // 8, ctx_size=4096
    )
    assert isinstance(result, BudgetShortfall)


def test_vllm_hybrid_length_leaves_room_for_the_sequence_state() -> None:
    """Qwen3-Next keeps ~78 MB of Mamba-style state per sequence besides its KV; a budget with
    room for 100,000 tokens of KV but not the state must come out shorter than 100,000."""
    est = estimate_shape(
        shape_of("qwen3-next-80b-a3b"), settings=EngineSettings(max_model_len=100_000)
    )
    short = est.kv_cache_bytes - 50 * 1024 * 1024  # drops below the state, not the tokens
    budget = est.total_bytes - est.kv_cache_bytes + short
    result = vllm_settings_for_budget(est, budget_bytes=budget, device_total_bytes=H100_BYTES * 2)
    assert isinstance(result, VllmLaunchSettings)
    state = est.kv_cache_bytes - 100_000 * est.kv_cache_bytes_per_token
    assert result.max_model_len < 100_000
    used = result.max_model_len * est.kv_cache_bytes_per_token + state
    assert used <= result.kv_cache_memory_bytes
