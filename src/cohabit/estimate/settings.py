"""EngineSettings: the engine configuration a deployment is sized for and launched with.

Admission parses it once from the model config (`EngineSettings.from_config`), the estimator
sizes exactly these settings, the store keeps them beside the estimate, and every launcher
turns the same object into engine flags — so the engine that runs is the one that was sized.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from cohabit.estimate.errors import InvalidSetting


class KvSizing(StrEnum):
    """How vLLM is held to its budget: `--gpu-memory-utilization` (a fraction of the card,
    profiled at start-up) or `--kv-cache-memory-bytes` (the KV cache in bytes, no profiling
    of what neighbours hold)."""

    UTILIZATION = "utilization"
    BYTES = "bytes"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The settings that change how much memory an engine takes (defaults: the engine's own).

    `max_model_len`, `max_num_seqs`, `max_num_batched_tokens` None: the engine's default
    for the device. `concurrency` is how many full-length sequences the reservation holds.
    `kv_sizing` None: the server's choice (`cohabit serve --vllm-kv-cache-bytes`).
    `pipeline_parallel` is for the estimator only: deployments place tensor-parallel shards,
    so a model config cannot set it. Out-of-range numbers raise InvalidSetting.
    """

    dtype: str = "auto"
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    concurrency: int = 1
    n_gpu_layers: int | None = None
    enforce_eager: bool = False
    flash_attn: bool = False
    kv_sizing: KvSizing | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _check(f.name, getattr(self, f.name), where=f.name)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, where: str = "config") -> EngineSettings:
        """Read the sizing keys of a model config (`tensor_parallel_size` is the config's
        name for `tensor_parallel`); other keys are not ours and are left alone. A value of
        the wrong type raises InvalidSetting naming the key and `where` it was found."""
        values: dict[str, Any] = {}
        for key, name in CONFIG_KEYS.items():
            if key not in config:
                continue
            values[name] = _check(name, config[key], where=f"{where}: {key}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, keyed by field name (what the store keeps)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> EngineSettings:
        """The inverse of `to_dict`; unknown keys (from a newer version) are ignored."""
        if not data:
            return cls()
        names = {f.name for f in fields(cls)}
        values = {k: _check(k, v, where=k) for k, v in data.items() if k in names}
        return cls(**values)


# The model config's key for each field (the reference API's names where it has one).
CONFIG_KEYS = {
    "dtype": "dtype",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "tensor_parallel_size": "tensor_parallel",
    "concurrency": "concurrency",
    "n_gpu_layers": "n_gpu_layers",
    "enforce_eager": "enforce_eager",
    "flash_attn": "flash_attn",
    "kv_sizing": "kv_sizing",
}
_STRINGS = ("dtype", "quantization", "kv_cache_dtype")
_OPTIONAL_INTS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "n_gpu_layers")
_INTS = ("tensor_parallel", "pipeline_parallel", "concurrency")
_BOOLS = ("enforce_eager", "flash_attn")


def _check(name: str, value: Any, *, where: str) -> Any:
    """One value of the right type, or InvalidSetting that says what was expected."""
    if name in _STRINGS:
        if not isinstance(value, str) or not value:
            raise InvalidSetting(f"{where} must be a non-empty string, got {value!r}")
        return value
    if name in _OPTIONAL_INTS or name in _INTS:
        if value is None and name in _OPTIONAL_INTS:
            return None
        # bool is an int in Python; `true` for a length is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSetting(f"{where} must be a whole number, got {value!r}")
        least = 0 if name == "n_gpu_layers" else 1
        if value < least:
            raise InvalidSetting(f"{where} must be at least {least}, got {value}")
        return value
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise InvalidSetting(f"{where} must be true or false, got {value!r}")
        return value
    if value is None or isinstance(value, KvSizing):
        return value
    try:
        return KvSizing(value)
    except ValueError:
        allowed = ", ".join(k.value for k in KvSizing)
        raise InvalidSetting(f"{where} must be one of {allowed}, got {value!r}") from None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, StrEnum) else value
