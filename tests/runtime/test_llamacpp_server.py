"""A real llama.cpp server (llama-cpp-python's) started by LocalRuntime on the tiny model:
ready, answering chat completions over HTTP on 127.0.0.1, stopped with its process group
gone. No GPU and no download: the model is written by the test (context 256)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from cohabit.estimate.settings import EngineSettings
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.interface import EngineHandle, EngineState, LaunchRequest, RuntimeErrorCode
from cohabit.runtime.process import group_alive
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.runtime.conftest import FLEETS, wait_for

Runtimes = Callable[..., LocalRuntime]
READY_TIMEOUT_S = 60.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_json(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with _DIRECT.open(request, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())  # type: ignore[no-any-return]


def chat(handle: EngineHandle, model: str) -> dict[str, object]:
    return post_json(
        f"{handle.base_url}/v1/chat/completions",
        {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
    )


def launch(placement: Placement, model: Path, engine: str = "llamacpp") -> LaunchRequest:
    return LaunchRequest(
        deployment_id=placement.name,
        engine=engine,
        model_path=str(model),
        served_model_name=placement.name,
        placement=placement,
        budget_bytes=placement.allocated_bytes,
        device_total_bytes=placement.first.total_bytes,
        settings=EngineSettings(max_model_len=256),
    )


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "models" / "tiny.gguf", seed=7)


@pytest.mark.slow
def test_two_tiny_models_share_a_simulated_16gib_gpu(runtimes: Runtimes, tiny: Path) -> None:
    """Two 6 GiB deployments on one simulated 16 GiB card: both serve, one at a time
    started; stopping one leaves no process of it and the other still answers."""
    runtime = runtimes(startup_timeout_s=READY_TIMEOUT_S)
    requests = [PlacementRequest(name=n, vram_bytes=6 * GIB) for n in ("tiny-a", "tiny-b")]
    placements = plan_online(FleetState(fleet=FLEETS["gpu16"]), requests)
    assert all(isinstance(p, Placement) and p.gpu_indices == [0] for p in placements)
    handles = [runtime.start(launch(p, tiny, engine="auto")) for p in placements]  # type: ignore[arg-type]
    assert handles[1].pid is None  # held until the first is ready
    for handle in handles:
        status = wait_for(
            runtime, handle, EngineState.READY, EngineState.FAILED, timeout_s=READY_TIMEOUT_S
        )
        assert status.state is EngineState.READY, runtime.logs(handle, tail=20)
    first, second = (runtime.start(launch(p, tiny)) for p in placements)  # type: ignore[arg-type]
    reply = chat(first, "tiny-a")
    choice = reply["choices"][0]  # type: ignore[index]
    assert reply["model"] == "tiny-a"
    assert choice["finish_reason"] == "length" and len(choice["message"]["content"]) > 0
    assert chat(second, "tiny-b")["usage"]["completion_tokens"] == 8  # type: ignore[index]
    runtime.stop(first)
    assert first.pid is not None and not group_alive(first.pid)
    assert runtime.status(first).state is EngineState.STOPPED
    assert chat(second, "tiny-b")["model"] == "tiny-b"


@pytest.mark.slow
def test_cpu_pool_replies_are_repeatable(runtimes: Runtimes, tiny: Path) -> None:
    """On a CPU pool nothing is offloaded; the same seed and prompt give the same reply."""
    runtime = runtimes(startup_timeout_s=READY_TIMEOUT_S)
    (placement,) = plan_online(
        FleetState(fleet=FLEETS["cpu"]), [PlacementRequest(name="tiny-cpu", vram_bytes=6 * GIB)]
    )
    assert isinstance(placement, Placement)
    handle = runtime.start(launch(placement, tiny))
    wait_for(runtime, handle, EngineState.READY, timeout_s=READY_TIMEOUT_S)
    body = {"model": "tiny-cpu", "prompt": "hello", "max_tokens": 8, "temperature": 0}
    first = post_json(f"{handle.base_url}/v1/completions", body)
    again = post_json(f"{handle.base_url}/v1/completions", body)
    assert first["choices"][0]["text"] == again["choices"][0]["text"]  # type: ignore[index]
    command = Path(handle.log_path or "").read_text().splitlines()[0]
    assert command.startswith("[cohabit] ") and "--n_gpu_layers 0" in command
    runtime.stop(handle)
    assert handle.pid is not None and not group_alive(handle.pid)


@pytest.mark.slow
def test_corrupt_gguf_fails_with_llamas_own_line(runtimes: Runtimes, tiny: Path) -> None:
    tiny.write_bytes(b"GGUF" + b"\x00" * 64)
    runtime = runtimes(startup_timeout_s=READY_TIMEOUT_S)
    (placement,) = plan_online(
        FleetState(fleet=FLEETS["cpu"]), [PlacementRequest(name="broken", vram_bytes=6 * GIB)]
    )
    handle = runtime.start(launch(placement, tiny))  # type: ignore[arg-type]
    status = wait_for(runtime, handle, EngineState.FAILED, timeout_s=READY_TIMEOUT_S)
    assert status.error_code is RuntimeErrorCode.MODEL_LOADING_FAILURE
    assert "Failed to load model from file" in (status.error_message or "")


@pytest.mark.slow
def test_a_name_and_a_model_path_that_look_like_flags(
    runtimes: Runtimes, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served name and a model path (relative to the server's folder) that start with `-`:
    the real server loads the model and answers under that name."""
    monkeypatch.chdir(tiny.parent)
    tiny.rename(tiny.with_name("-tiny.gguf"))
    runtime = runtimes(startup_timeout_s=READY_TIMEOUT_S)
    (placement,) = plan_online(
        FleetState(fleet=FLEETS["cpu"]), [PlacementRequest(name="dash", vram_bytes=6 * GIB)]
    )
    assert isinstance(placement, Placement)
    request = replace(launch(placement, Path("-tiny.gguf")), served_model_name="--port")
    handle = runtime.start(request)
    status = wait_for(
        runtime, handle, EngineState.READY, EngineState.FAILED, timeout_s=READY_TIMEOUT_S
    )
    assert status.state is EngineState.READY, runtime.logs(handle, tail=20)
    assert chat(handle, "--port")["model"] == "--port"
