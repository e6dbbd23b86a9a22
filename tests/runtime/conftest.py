"""Runtime test helpers: placements on small simulated fleets, launch requests and a bounded
wait for a state (LocalRuntimes that stop everything they started: tests/conftest.py)."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cohabit.estimate.estimate import Estimate
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.engines.spec import LaunchSpec, base_url
from cohabit.runtime.interface import EngineHandle, EngineState, EngineStatus, LaunchRequest
from cohabit.runtime.spawner import LocalRuntime
from cohabit.units import GIB
from tests.conftest import FIXTURES

FAKE_ENGINE = FIXTURES / "runtime" / "fake_engine.py"
FAKE_VLLM = FIXTURES / "runtime" / "fake_vllm.py"


def gpu_node(name: str, *gibs: int, vendor: Vendor = Vendor.NVIDIA) -> Node:
    return Node(
        name=name,
        gpus=tuple(
            Gpu(
                index=i,
                vendor=vendor,
                product="H100" if vendor is Vendor.NVIDIA else "MI300X",
                memory_bytes=g * GIB,
                accel_version="12.4" if vendor is Vendor.NVIDIA else "6.2",
                uuid=f"GPU-{name}-{i}",
            )
            for i, g in enumerate(gibs)
        ),
    )


FLEETS: dict[str, Fleet] = {
    "nvidia": Fleet(nodes=(gpu_node("node-a", 80, 80),)),
    "amd": Fleet(nodes=(gpu_node("node-b", 192, vendor=Vendor.AMD),)),
    "mig": Fleet(
        nodes=(
            Node(
                name="node-m",
                gpus=(
                    Gpu(
                        index=0,
                        vendor=Vendor.NVIDIA,
                        product="A100",
                        memory_bytes=80 * GIB,
                        accel_version="12.4",
                        uuid="GPU-5d2a",
                        partitions=(
                            Partition(
                                profile="3g.40gb",
                                memory_bytes=40 * GIB,
                                uuid="MIG-1f3c9a2e-77aa-5b1c-9e0d-2b6a9c1d4e5f",
                            ),
                        ),
                    ),
                ),
            ),
        )
    ),
    "cpu": Fleet(nodes=(Node(name="host", memory_bytes=24 * GIB),)),
    "apple": Fleet(
        nodes=(
            Node(
                name="mac",
                os="darwin",
                unified_memory_bytes=64 * GIB,
                gpus=(Gpu(index=0, vendor=Vendor.APPLE, product="Apple M2 Max"),),
            ),
        )
    ),
    "gpu16": Fleet(nodes=(gpu_node("local", 16),)),
}


def placement(fleet: str, gib: float, *, tp: int = 1, name: str = "dep") -> Placement:
    decision = plan(
        FleetState(fleet=FLEETS[fleet]),
        PlacementRequest(name=name, vram_bytes=int(gib * GIB), tensor_parallel=tp),
    )
    assert isinstance(decision, Placement), decision
    return decision


def launch_request(
    fleet: str,
    gib: float,
    *,
    engine: str = "fake",
    model_path: str = "/models/m",
    tp: int = 1,
    deployment_id: str = "dep-1",
    max_model_len: int | None = None,
    settings: EngineSettings | None = None,
    estimate: Estimate | None = None,
    extra_args: tuple[str, ...] = (),
) -> LaunchRequest:
    """A request for a `gib` budget on `fleet`; `max_model_len` is shorthand for settings
    that set only it."""
    chosen = placement(fleet, gib, tp=tp, name=deployment_id)
    return LaunchRequest(
        deployment_id=deployment_id,
        engine=engine,
        model_path=model_path,
        served_model_name="tiny",
        placement=chosen,
        budget_bytes=chosen.allocated_bytes,
        device_total_bytes=chosen.first.total_bytes,
        settings=settings or EngineSettings(max_model_len=max_model_len),
        estimate=estimate,
        extra_args=extra_args,
    )


def fake_launcher(*args: str) -> Callable[[LaunchRequest, int], LaunchSpec]:
    """A launcher that runs fake_engine.py with `args` (mode first) on the given port."""

    def launch(request: LaunchRequest, port: int) -> LaunchSpec:
        return LaunchSpec(
            engine="fake",
            argv=(sys.executable, str(FAKE_ENGINE), *args, "--port", str(port)),
            port=port,
            base_url=base_url(port),
            health_url=f"{base_url(port)}/health",
            startup_timeout_s=30.0,
        )

    return launch


def wait_for(
    runtime: LocalRuntime,
    handle: EngineHandle,
    *states: EngineState,
    timeout_s: float = 30.0,
) -> EngineStatus:
    """Poll status() (as the reconciler does) until one of `states`; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    status = runtime.status(handle)
    while status.state not in states:
        if time.monotonic() > deadline:
            pytest.fail(f"{handle.deployment_id} still {status} after {timeout_s} s")
        time.sleep(0.05)
        status = runtime.status(handle)
    return status


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A file where the fake engines' model should be (they never read it)."""
    path = tmp_path / "models" / "fake.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    return path


def fake_vllm_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, load_gate: Path | None = None
) -> Path:
    """A `vllm` that runs fake_vllm.py, first on PATH; returns the file it records into (named
    in the script: an engine gets none of the server's own variables). Creating
    `fail_wake_file(record)` makes the next wake of the engine fail; with `load_gate`, its
    load stops between starting to read the weights and having them until that file exists."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    record = tmp_path / "vllm-launch.json"
    script.write_text(
        f'#!/bin/sh\nFAKE_VLLM_RECORD="{record}" FAKE_VLLM_FAIL_WAKE="{fail_wake_file(record)}" '
        + (f'FAKE_VLLM_LOAD_GATE="{load_gate}" ' if load_gate is not None else "")
        + f'exec "{sys.executable}" "{FAKE_VLLM}" "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


def fail_wake_file(record: Path) -> Path:
    """The file whose presence makes fake_vllm.py fail its next wake (it removes it)."""
    return record.with_name("vllm-fail-wake")
