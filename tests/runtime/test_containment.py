"""LocalRuntime keeps one engine's fault to that engine, with real processes (fake engines,
tests/fixtures/runtime/fake_engine.py): a launch that Popen refuses (a NUL byte in the command
or the environment) and a fault while watching an engine fail that engine alone, never the
status of another; and stopping an engine whose control plane died finds it by its marks and
start time only — a process those do not match is never signalled. No GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from cohabit.runtime.engines.spec import LaunchSpec
from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    LaunchRequest,
    RuntimeErrorCode,
)
from cohabit.runtime.process import group_alive, pid_alive
from cohabit.runtime.spawner import LocalRuntime
from tests.runtime.conftest import fake_launcher, launch_request, wait_for

Runtimes = Callable[..., LocalRuntime]
DONE = (EngineState.READY, EngineState.FAILED)


def request(model: Path, deployment_id: str, engine: str = "fake") -> LaunchRequest:
    """Every request lands on the same 16 GiB GPU, so they start one after another."""
    return launch_request(
        "gpu16", 2, engine=engine, model_path=str(model), deployment_id=deployment_id
    )


def with_nul(where: str) -> Callable[[LaunchRequest, int], LaunchSpec]:
    """A launcher whose command (or environment) carries a NUL byte, as a model name with one
    would put it there."""
    serve = fake_launcher("serve")

    def launch(launch_request: LaunchRequest, port: int) -> LaunchSpec:
        spec = serve(launch_request, port)
        if where == "argv":
            return replace(spec, argv=(*spec.argv, "--alias", "t\x00x"))
        return replace(spec, env={"MODEL_NAME": "t\x00x"})

    return launch


@pytest.mark.parametrize("where", ["argv", "env"])
def test_a_launch_popen_refuses_fails_that_engine_alone(
    runtimes: Runtimes, model_file: Path, where: str
) -> None:
    runtime = runtimes(
        launchers={
            "slow": fake_launcher("serve", "--delay", "0.8"),
            "fake": fake_launcher("serve"),
            "nul": with_nul(where),
        }
    )
    first = runtime.start(request(model_file, "first", "slow"))
    bad = runtime.start(request(model_file, "bad", "nul"))
    assert bad.pid is None  # held behind the first start-up: Popen runs from a later call
    # The status calls that launch it never raise for the others.
    assert wait_for(runtime, first, *DONE).state is EngineState.READY
    failed = wait_for(runtime, bad, *DONE)
    assert (failed.state, failed.error_code) == (EngineState.FAILED, RuntimeErrorCode.RUNTIME_ERROR)
    assert failed.error_message == f"cannot run {sys.executable!r}: embedded null byte"
    assert failed.error_at is not None and failed.pid is None
    later = runtime.start(request(model_file, "later"))
    assert wait_for(runtime, later, *DONE).state is EngineState.READY
    assert runtime.status(first).state is EngineState.READY


def test_a_fault_while_watching_one_engine_fails_it_alone(
    runtimes: Runtimes, model_file: Path
) -> None:
    """The engine dies and its log has become a directory: reading its last lines raises."""
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    healthy = runtime.start(request(model_file, "healthy"))
    assert wait_for(runtime, healthy, *DONE).state is EngineState.READY
    victim = runtime.start(request(model_file, "victim"))
    assert wait_for(runtime, victim, *DONE).state is EngineState.READY
    assert victim.pid is not None and victim.log_path is not None
    os.unlink(victim.log_path)
    os.mkdir(victim.log_path)
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (failed := runtime.status(victim)).state is not EngineState.FAILED:
        assert runtime.status(healthy).state is EngineState.READY  # it never raises either
        assert time.monotonic() < deadline, failed
        time.sleep(0.05)
    assert (failed.state, failed.error_code) == (EngineState.FAILED, RuntimeErrorCode.RUNTIME_ERROR)
    assert (failed.error_message or "").startswith("IsADirectoryError: [Errno 21] Is a directory")
    assert not group_alive(victim.pid)
    assert runtime.status(healthy).state is EngineState.READY


def test_an_engine_whose_pid_was_never_recorded_is_found_by_its_marks(
    runtimes: Runtimes, model_file: Path
) -> None:
    """Its control plane died between Popen and writing engine.json: the next one stops it
    with nothing but the deployment's id."""
    before = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = before.start(request(model_file, "unrecorded"))
    wait_for(before, handle, EngineState.READY)
    assert handle.pid is not None
    (Path(handle.log_path or "").parent / "engine.json").unlink()
    after = runtimes()
    after.stop(EngineHandle(deployment_id="unrecorded"))
    assert not group_alive(handle.pid)


def test_a_pid_whose_start_time_differs_is_never_signalled(
    runtimes: Runtimes, model_file: Path
) -> None:
    """engine.json names the pid of a live engine of this deployment, but another start time:
    that process is not the one recorded (a reused pid), so stop leaves it alone. A process
    without the marks is left alone too."""
    before = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = before.start(request(model_file, "reused"))
    wait_for(before, handle, EngineState.READY)
    assert handle.pid is not None and handle.log_path is not None
    state = Path(handle.log_path).parent / "engine.json"
    saved = json.loads(state.read_text())
    saved["create_time"] -= 100.0
    state.write_text(json.dumps(saved))
    after = runtimes()
    after.stop(EngineHandle(deployment_id="reused", pid=handle.pid))
    assert pid_alive(handle.pid, None)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        after.stop(EngineHandle(deployment_id="stranger", pid=stranger.pid))
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
