"""The spawner sizes an engine from the estimate admission made, with the settings admission
parsed: it never re-estimates with defaults, and when the model's files changed since
admission it re-estimates with the same settings and says so in the engine's log. The
engine is fake_engine.py behind a recording launcher (no GPU); the model is a real tiny
safetensors checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cohabit.estimate import EngineSettings, estimate_model
from cohabit.runtime.engines.spec import LaunchSpec
from cohabit.runtime.interface import EngineState, LaunchRequest
from cohabit.runtime.spawner import LocalRuntime
from tests.estimate.tinymodels import write_safetensors_model
from tests.runtime.conftest import fake_launcher, fake_vllm_on_path, launch_request, wait_for

SETTINGS = EngineSettings(max_model_len=128, max_num_seqs=4, kv_cache_dtype="fp8")


def recording(seen: list[LaunchRequest]) -> Callable[[LaunchRequest, int], LaunchSpec]:
    serve = fake_launcher("serve")

    def launch(request: LaunchRequest, port: int) -> LaunchSpec:
        seen.append(request)
        return serve(request, port)

    return launch


def start(runtimes: Callable[..., LocalRuntime], model: Path) -> tuple[LaunchRequest, str]:
    """Admit (estimate with SETTINGS), then start through a runtime; the request the
    launcher got and the engine's log."""
    admitted = estimate_model(model, engine="vllm", settings=SETTINGS)
    seen: list[LaunchRequest] = []
    runtime = runtimes(launchers={"vllm": recording(seen)})
    request = launch_request(
        "nvidia", 4, engine="vllm", model_path=str(model), settings=SETTINGS, estimate=admitted
    )
    handle = runtime.start(request)
    assert wait_for(runtime, handle, EngineState.READY).state is EngineState.READY
    runtime.stop(handle)
    assert handle.log_path is not None
    return seen[0], Path(handle.log_path).read_text()


def test_unchanged_files_launch_with_the_admission_estimate(
    runtimes: Callable[..., LocalRuntime], tmp_path: Path
) -> None:
    write_safetensors_model(tmp_path / "m")
    launched, log = start(runtimes, tmp_path / "m")
    assert launched.settings == SETTINGS
    assert launched.estimate == estimate_model(tmp_path / "m", engine="vllm", settings=SETTINGS)
    assert "re-estimated" not in log


def test_changed_files_are_re_estimated_with_the_same_settings(
    runtimes: Callable[..., LocalRuntime], tmp_path: Path
) -> None:
    model = tmp_path / "m"
    write_safetensors_model(model)
    admitted = estimate_model(model, engine="vllm", settings=SETTINGS)
    # Another checkpoint lands under the same path: four layers instead of two.
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 4}))
    seen: list[LaunchRequest] = []
    runtime = runtimes(launchers={"vllm": recording(seen)})
    request = launch_request(
        "nvidia", 4, engine="vllm", model_path=str(model), settings=SETTINGS, estimate=admitted
    )
    handle = runtime.start(request)
    wait_for(runtime, handle, EngineState.READY)
    runtime.stop(handle)
    (launched,) = seen
    fresh = estimate_model(model, engine="vllm", settings=SETTINGS)
    assert launched.estimate == fresh
    assert fresh.kv_cache_bytes_per_token == 2 * admitted.kv_cache_bytes_per_token
    assert (fresh.max_num_seqs, fresh.kv_cache_dtype) == (4, "fp8")
    assert handle.log_path is not None
    assert "model files changed since admission; re-estimated with the same settings" in (
        Path(handle.log_path).read_text()
    )


def test_hami_core_gets_each_deployment_its_own_region_file(
    runtimes: Callable[..., LocalRuntime], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--enforce hami-core` as the spawner applies it, read from the real environment of a
    `vllm` process (fake_vllm.py first on PATH). The library path is a stand-in: the loader
    ignores a preload it cannot find, and there is no GPU here for HAMi-core to act on."""
    record = fake_vllm_on_path(tmp_path, monkeypatch)
    write_safetensors_model(tmp_path / "m")
    library = str(tmp_path / "libvgpu.so")
    runtime = runtimes(hard_limit_library=library)
    settings = EngineSettings(max_model_len=128)
    request = launch_request(
        "nvidia", 4, engine="vllm", model_path=str(tmp_path / "m"), settings=settings,
        estimate=estimate_model(tmp_path / "m", engine="vllm", settings=settings),
    )  # fmt: skip
    handle = runtime.start(request)
    status = wait_for(runtime, handle, EngineState.READY, EngineState.FAILED)
    assert status.state is EngineState.READY, status.error_message
    runtime.stop(handle)
    env = json.loads(record.read_text())["env"]
    region = tmp_path / "data" / "engines" / "dep-1" / "hami.cache"
    assert {k: env[k] for k in env if k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))} == {
        "LD_PRELOAD": library,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(region),
    }
