"""Which engine serves a deployment, and each engine's pure `build_launch()`.

`choose_engine()` answers for a request that names none: a GGUF file → llama.cpp; a
safetensors checkpoint → vLLM on an NVIDIA/AMD GPU, MLX on Apple silicon; anything else is
an `EngineChoiceError` that says why. The spawner and the control plane call it.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.placement.decision import Placement
from cohabit.runtime.errors import EngineChoiceError

ENGINES = ("vllm", "llamacpp", "mlx")


class ModelFormat(StrEnum):
    GGUF = "gguf"
    SAFETENSORS = "safetensors"  # a Hugging Face directory: config.json + *.safetensors


def model_format(model_path: str | Path) -> ModelFormat | None:
    """The format of the files at `model_path`, or None when nothing usable is there (the
    caller reports that as MUST_REDOWNLOAD)."""
    path = Path(model_path)
    if path.is_file():
        return ModelFormat.GGUF if path.suffix == ".gguf" else None
    if path.is_dir():
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            return ModelFormat.SAFETENSORS
        if any(path.glob("*.gguf")):
            return ModelFormat.GGUF
    return None


def choose_engine(fmt: ModelFormat, placement: Placement) -> str:
    """The engine for a model format on the placed hardware: GGUF runs anywhere on llama.cpp
    (CPU included); safetensors needs vLLM's or MLX's hardware."""
    if fmt is ModelFormat.GGUF:
        return "llamacpp"
    vendor = placement.gpu_vendor
    if vendor in (Vendor.NVIDIA, Vendor.AMD) and placement.hardware_class is not HardwareClass.CPU:
        return "vllm"
    if vendor is Vendor.APPLE:
        return "mlx"
    raise EngineChoiceError(
        f"{placement.name}: no engine serves a safetensors checkpoint on "
        f"{placement.first.location} ({vendor.value}); llama.cpp needs a GGUF file — "
        "convert the model to GGUF, or place it on an NVIDIA/AMD GPU or Apple silicon"
    )


def check_engine(engine: str, fmt: ModelFormat, placement: Placement) -> None:
    """Raise EngineChoiceError when a named engine cannot run this format on this hardware."""
    check_hardware(engine, placement)
    if engine == "llamacpp" and fmt is not ModelFormat.GGUF:
        raise EngineChoiceError(
            f"{placement.name}: llama.cpp serves GGUF files, not a {fmt.value} checkpoint"
        )
    if engine == "mlx" and fmt is not ModelFormat.SAFETENSORS:
        raise EngineChoiceError(f"{placement.name}: MLX serves safetensors checkpoints, not GGUF")


def check_hardware(engine: str, placement: Placement) -> None:
    """Raise EngineChoiceError when `engine` cannot run on the placed hardware: vLLM needs an
    NVIDIA or AMD GPU (or MIG slice), MLX Apple silicon; llama.cpp runs anywhere."""
    where = f"{placement.first.location} ({placement.gpu_vendor.value})"
    if engine not in ENGINES:
        raise EngineChoiceError(
            f"{placement.name}: unknown engine {engine!r} (known: {', '.join(ENGINES)})"
        )
    on_gpu = placement.hardware_class is not HardwareClass.CPU
    if engine == "vllm" and not (on_gpu and placement.gpu_vendor in (Vendor.NVIDIA, Vendor.AMD)):
        raise EngineChoiceError(f"{placement.name}: vLLM needs an NVIDIA or AMD GPU, not {where}")
    if engine == "mlx" and placement.gpu_vendor is not Vendor.APPLE:
        raise EngineChoiceError(f"{placement.name}: MLX runs on Apple silicon only, not {where}")
