"""Engine choice when a request names none, and the combinations that cannot run."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohabit.runtime.engines import ModelFormat, check_engine, choose_engine, model_format
from cohabit.runtime.errors import EngineChoiceError
from tests.runtime.conftest import placement

GGUF, ST = ModelFormat.GGUF, ModelFormat.SAFETENSORS


@pytest.mark.parametrize(
    ("fmt", "fleet", "engine"),
    [
        pytest.param(ModelFormat.GGUF, "nvidia", "llamacpp", id="gguf-nvidia"),
        pytest.param(ModelFormat.GGUF, "cpu", "llamacpp", id="gguf-cpu"),
        pytest.param(ModelFormat.GGUF, "apple", "llamacpp", id="gguf-apple"),
        pytest.param(ModelFormat.SAFETENSORS, "nvidia", "vllm", id="safetensors-nvidia"),
        pytest.param(ModelFormat.SAFETENSORS, "mig", "vllm", id="safetensors-mig"),
        pytest.param(ModelFormat.SAFETENSORS, "amd", "vllm", id="safetensors-amd"),
        pytest.param(ModelFormat.SAFETENSORS, "apple", "mlx", id="safetensors-apple"),
    ],
)
def test_choose_engine(fmt: ModelFormat, fleet: str, engine: str) -> None:
    assert choose_engine(fmt, placement(fleet, 10)) == engine


def test_safetensors_on_a_cpu_pool_says_what_to_do() -> None:
    with pytest.raises(EngineChoiceError, match=r"host cpu pool \(cpu\); llama.cpp needs a GGUF"):
        choose_engine(ModelFormat.SAFETENSORS, placement("cpu", 10))


@pytest.mark.parametrize(
    ("engine", "fmt", "fleet", "message"),
    [
        pytest.param("vllm", ST, "apple", "vLLM needs an NVIDIA or AMD", id="vllm-apple"),
        pytest.param("vllm", ST, "cpu", "vLLM needs an NVIDIA or AMD", id="vllm-cpu"),
        pytest.param("mlx", ST, "nvidia", "MLX runs on Apple silicon only", id="mlx-nvidia"),
        pytest.param("mlx", GGUF, "apple", "MLX serves safetensors", id="mlx-gguf"),
        pytest.param("llamacpp", ST, "nvidia", "llama.cpp serves GGUF", id="llamacpp-safetensors"),
        pytest.param("tgi", GGUF, "nvidia", "unknown engine 'tgi'", id="unknown"),
    ],
)  # fmt: skip
def test_impossible_engine_combinations(
    engine: str, fmt: ModelFormat, fleet: str, message: str
) -> None:
    with pytest.raises(EngineChoiceError, match=message):
        check_engine(engine, fmt, placement(fleet, 10))


@pytest.mark.parametrize(
    ("engine", "fmt", "fleet"),
    [
        pytest.param("llamacpp", ModelFormat.GGUF, "cpu", id="llamacpp-cpu"),
        pytest.param("vllm", ModelFormat.SAFETENSORS, "amd", id="vllm-amd"),
        pytest.param("mlx", ModelFormat.SAFETENSORS, "apple", id="mlx-apple"),
    ],
)
def test_possible_engine_combinations(engine: str, fmt: ModelFormat, fleet: str) -> None:
    check_engine(engine, fmt, placement(fleet, 10))


def _safetensors_dir(root: Path) -> Path:
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"")
    return root


@pytest.mark.parametrize(
    ("make", "fmt"),
    [
        pytest.param(lambda d: _touch(d / "m.gguf"), GGUF, id="gguf-file"),
        pytest.param(lambda d: _touch(d / "m-00001-of-00002.gguf").parent, GGUF, id="gguf-dir"),
        pytest.param(_safetensors_dir, ST, id="safetensors-dir"),
        pytest.param(lambda d: _touch(d / "config.json").parent, None, id="config-no-weights"),
        pytest.param(lambda d: d / "gone.gguf", None, id="missing-file"),
        pytest.param(lambda d: _touch(d / "weights.bin"), None, id="unknown-file"),
    ],
)  # fmt: skip
def test_model_format(tmp_path: Path, make: object, fmt: ModelFormat | None) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    assert model_format(path) is fmt


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path
