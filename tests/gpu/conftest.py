"""Real-GPU checks: opt-in only (`pytest -m gpu`, which scripts/gpu_check.sh runs); a plain
run deselects them, as it does the real-cluster tests, so CI neither fails on them nor reports
them as skipped. Run on a machine without an NVIDIA GPU they fail, saying so.

`gpu_mig` marks the check that needs a MIG slice; gpu_check.sh leaves it out on a machine
without MIG mode on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cohabit.hardware.model import Node
from cohabit.hardware.nvidia import discover_nvidia
from tests.conftest import run_only_when_asked
from tests.e2e.engines import kill_engines

GPU_MARKER = "gpu"
MIG_MARKER = "gpu_mig"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MIG_MARKER}: needs an NVIDIA GPU with MIG slices")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_only_when_asked(config, items, GPU_MARKER)


@pytest.fixture(scope="session")
def machine() -> Node:
    """This machine's NVIDIA GPUs, read through the real NVML; a failure when there are none."""
    node = discover_nvidia(name="gpu-host")
    if node is None or not node.gpus:
        pytest.fail("the gpu tests need an NVIDIA GPU and its driver (NVML found none)")
    return node


@pytest.fixture
def llama_server() -> str:
    """A CUDA build of llama.cpp's server on PATH; a failure when there is none."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder) / "llama-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail("the gpu tests need llama.cpp's llama-server (a CUDA build) on PATH")


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path / "data"
    finally:
        kill_engines(tmp_path / "data")
