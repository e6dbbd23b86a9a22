"""EngineSettings from a model config: the sizing keys, typed, with one message naming the
key for a value of the wrong type or range; and the round trip through the store's dict."""

from __future__ import annotations

from typing import Any

import pytest

from cohabit.estimate import EngineSettings, InvalidSetting, KvSizing

TP = "tensor_parallel_size"


def test_config_keys_become_fields_and_foreign_keys_are_left_alone() -> None:
    config = {
        "engine": "vllm",
        "tensor_parallel_size": 2,
        "max_model_len": 4096,
        "max_num_seqs": 16,
        "kv_cache_dtype": "fp8",
        "kv_sizing": "bytes",
        "chat_template": "whatever",
    }
    assert EngineSettings.from_config(config) == EngineSettings(
        tensor_parallel=2,
        max_model_len=4096,
        max_num_seqs=16,
        kv_cache_dtype="fp8",
        kv_sizing=KvSizing.BYTES,
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tensor_parallel_size": "two"}, f"cfg: {TP} must be a whole number, got 'two'"),
        ({"tensor_parallel_size": None}, f"cfg: {TP} must be a whole number, got None"),
        ({"tensor_parallel_size": 0}, f"cfg: {TP} must be at least 1, got 0"),
        ({"max_model_len": True}, "cfg: max_model_len must be a whole number, got True"),
        ({"max_num_seqs": 2.5}, "cfg: max_num_seqs must be a whole number, got 2.5"),
        ({"n_gpu_layers": -1}, "cfg: n_gpu_layers must be at least 0, got -1"),
        ({"dtype": 16}, "cfg: dtype must be a non-empty string, got 16"),
        ({"enforce_eager": "yes"}, "cfg: enforce_eager must be true or false, got 'yes'"),
        ({"kv_sizing": "auto"}, "cfg: kv_sizing must be one of utilization, bytes, got 'auto'"),
    ],
)  # fmt: skip
def test_a_wrong_value_names_its_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSetting) as raised:
        EngineSettings.from_config(config, where="cfg")
    assert str(raised.value) == message


def test_null_optional_limits_mean_the_engine_default() -> None:
    assert EngineSettings.from_config({"max_model_len": None}) == EngineSettings()


def test_dict_round_trip() -> None:
    settings = EngineSettings(max_model_len=4096, kv_sizing=KvSizing.UTILIZATION, concurrency=2)
    assert settings.to_dict()["kv_sizing"] == "utilization"
    assert EngineSettings.from_dict(settings.to_dict()) == settings
    assert EngineSettings.from_dict({}) == EngineSettings()
    assert EngineSettings.from_dict({**settings.to_dict(), "from_a_newer_version": 1}) == settings
