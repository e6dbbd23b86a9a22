"""The pre-imported launcher (runtime/forkserver.py) with the real llama.cpp server of
llama-cpp-python on the tiny model: engines forked from it serve, are found again by a
restarted runtime, stop with their exit code, and fail with their own words; an engine whose
environment differs in more than the device variables, or a launcher that holds a device
file, starts a fresh process instead. No GPU: the device check is exercised with a file the
parked process does hold open (/dev/null, its stdin)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from cohabit.placement.planner import plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime import forkserver
from cohabit.runtime.engines import llamacpp
from cohabit.runtime.interface import EngineState, LaunchRequest, RuntimeErrorCode
from cohabit.runtime.process import DEPLOYMENT_MARK, FORKED_MARK, group_alive
from cohabit.runtime.spawner import EXIT_FILE, LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.runtime.conftest import FLEETS, wait_for
from tests.runtime.test_llamacpp_server import READY_TIMEOUT_S, chat, launch

FORKED_NOTE = "forked from the pre-imported llama_cpp.server"


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "models" / "tiny.gguf", seed=7)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[LocalRuntime]:
    """A runtime whose llama.cpp launcher has imported and said it is ready."""
    made = LocalRuntime(tmp_path / "data", startup_timeout_s=READY_TIMEOUT_S)
    assert made.preimport() == [llamacpp.ENGINE]
    assert made._forkservers[llamacpp.ENGINE].wait_ready()
    yield made
    made.stop_all()
    made.close_launchers()


def request_for(name: str, model: Path) -> LaunchRequest:
    (placement,) = plan_online(
        FleetState(fleet=FLEETS["cpu"]), [PlacementRequest(name=name, vram_bytes=1 * GIB)]
    )
    return launch(placement, model)  # type: ignore[arg-type]


def log_of(runtime: LocalRuntime, name: str) -> str:
    return (runtime.data_dir / "engines" / name / "engine.log").read_text()


@pytest.mark.slow
def test_a_forked_engine_serves_is_found_again_and_stops_with_its_code(
    runtime: LocalRuntime, tiny: Path
) -> None:
    handle = runtime.start(request_for("tiny-f", tiny))
    wait_for(runtime, handle, EngineState.READY, timeout_s=READY_TIMEOUT_S)
    assert FORKED_NOTE in log_of(runtime, "tiny-f")
    assert "read ahead 1 weight file(s)" in log_of(runtime, "tiny-f")
    assert chat(handle, "tiny-f")["model"] == "tiny-f"
    assert handle.pid is not None
    engine = psutil.Process(handle.pid)
    # A child of the launcher, leading its own group, whose /proc environment is the
    # launcher's: marked as forked, without the deployment, which its folder tells.
    assert engine.ppid() == runtime._forkservers[llamacpp.ENGINE].process.pid  # type: ignore[union-attr]
    assert os.getpgid(handle.pid) == handle.pid
    assert FORKED_MARK in engine.environ() and DEPLOYMENT_MARK not in engine.environ()
    assert Path(engine.cwd()) == runtime.data_dir / "engines" / "tiny-f"

    later = LocalRuntime(runtime.data_dir)  # a restarted control plane
    assert [h.deployment_id for h in later.engines()] == ["tiny-f"]
    adopted = later.adopt(replace(handle, base_url=None))
    assert adopted is not None and adopted.pid == handle.pid
    assert later.status(adopted).state is EngineState.READY

    runtime.stop(handle)
    status = runtime.status(handle)
    assert status.state is EngineState.STOPPED
    assert status.exit_code == -15  # SIGTERM, as the launcher reaped it
    assert not group_alive(handle.pid)
    assert (runtime.data_dir / "engines" / "tiny-f" / EXIT_FILE).read_text().strip() == "-15"


@pytest.mark.slow
def test_a_forked_engine_that_cannot_load_fails_with_llamas_own_line(
    runtime: LocalRuntime, tiny: Path
) -> None:
    tiny.write_bytes(b"GGUF" + b"\x00" * 64)
    handle = runtime.start(request_for("broken", tiny))
    status = wait_for(runtime, handle, EngineState.FAILED, timeout_s=READY_TIMEOUT_S)
    assert FORKED_NOTE in log_of(runtime, "broken")
    assert status.error_code is RuntimeErrorCode.MODEL_LOADING_FAILURE
    assert "Failed to load model from file" in (status.error_message or "")
    assert status.exit_code == 1


@pytest.mark.slow
def test_an_engine_with_an_environment_of_its_own_starts_afresh(
    runtime: LocalRuntime, tiny: Path
) -> None:
    """A variable the engine's libraries may read at import (here one of llama.cpp's) can
    only reach it through a fresh process."""
    request = replace(request_for("own-env", tiny), env={"GGML_SCHED_MAX_COPIES": "1"})
    handle = runtime.start(request)
    wait_for(runtime, handle, EngineState.READY, timeout_s=READY_TIMEOUT_S)
    assert FORKED_NOTE not in log_of(runtime, "own-env")
    assert handle.pid is not None
    assert psutil.Process(handle.pid).environ()[DEPLOYMENT_MARK] == "own-env"


@pytest.mark.slow
def test_a_launcher_holding_a_device_file_is_not_used(
    tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parked process holds /dev/null (its stdin); counted as a device file, it is taken
    for a process that opened a GPU before the fork: it is stopped, and engines start as
    fresh processes."""
    monkeypatch.setattr(forkserver, "DEVICE_FILES", ("/dev/null",))
    made = LocalRuntime(tmp_path / "data", startup_timeout_s=READY_TIMEOUT_S)
    made.preimport()
    server = made._forkservers[llamacpp.ENGINE]
    try:
        assert not server.wait_ready()
        assert not server.alive()
        handle = made.start(request_for("fresh", tiny))
        wait_for(made, handle, EngineState.READY, timeout_s=READY_TIMEOUT_S)
        assert FORKED_NOTE not in log_of(made, "fresh")
    finally:
        made.stop_all()
        made.close_launchers()


def test_the_parked_process_has_no_device_open_and_ends_with_its_server(tmp_path: Path) -> None:
    """A launcher of a small module: ready with no GPU device file open; when the control
    socket closes (its server died) it exits."""
    server = forkserver.ForkServer(
        "probe", ("json",), env=dict(os.environ), cwd=tmp_path / "launcher"
    )
    server.start(tmp_path / "launcher.log")
    assert server.wait_ready()
    assert server.process is not None
    assert forkserver.device_handles(server.process.pid) == []
    assert server._control is not None
    server._control.close()  # what the server's death does to it
    assert server.process.wait(timeout=10.0) == 0


def test_device_handles_reads_what_a_process_holds_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkserver, "DEVICE_FILES", ("/dev/null",))
    with open(os.devnull) as held:
        assert "/dev/null" in forkserver.device_handles(os.getpid())
        assert held.fileno() > 2
    assert forkserver.device_handles(2**22 + 1) == []  # no such process


def test_an_exit_code_is_read_only_when_whole(tmp_path: Path) -> None:
    path = tmp_path / EXIT_FILE
    assert forkserver.read_exit(path) is None
    path.write_text("-9\n")
    assert forkserver.read_exit(path) == -9
    path.write_text("")
    assert forkserver.read_exit(path) is None


PRINTENV = """import json, os, sys
print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:]}))
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_child_runs_the_module_with_its_own_arguments_env_and_folder(
    tmp_path: Path,
) -> None:
    """Without an engine: a launcher of a module that prints what it runs with. The child
    has exactly the environment asked for (none of the launcher's), the folder and the
    arguments; its output reaches the descriptor sent and its exit code the exit file."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "printenv.py").write_text(PRINTENV)
    launcher_env = {"PYTHONPATH": str(modules), "LAUNCHER_ONLY": "1"}
    server = forkserver.ForkServer("probe", ("json",), env=launcher_env, cwd=tmp_path / "launcher")
    server.start(tmp_path / "launcher.log")
    try:
        assert server.wait_ready()
        folder = tmp_path / "engine"
        folder.mkdir()
        exits = []
        for code in ("0", "3"):
            out = folder / f"out-{code}.txt"
            fd = os.open(out, os.O_WRONLY | os.O_CREAT)
            try:
                child = server.spawn(
                    forkserver.Request(
                        module="printenv",
                        argv=(code, "--flag=x"),
                        env={"PROBE": "1"},
                        cwd=str(folder),
                        exit_file=str(folder / f"exit-{code}"),
                    ),
                    fd,
                )
            finally:
                os.close(fd)
            exits.append(child.wait(timeout=30.0))
            said = json.loads(out.read_text())
            assert said == {"env": {"PROBE": "1"}, "cwd": str(folder), "argv": [code, "--flag=x"]}
        assert exits == [0, 3]
        assert forkserver.read_exit(folder / "exit-3") == 3
    finally:
        server.stop()


def test_a_request_to_a_dead_launcher_is_an_error_not_a_hang(tmp_path: Path) -> None:
    server = forkserver.ForkServer("probe", ("json",), env={}, cwd=tmp_path / "launcher")
    server.start(tmp_path / "launcher.log")
    assert server.wait_ready()
    assert server.process is not None
    server.process.kill()
    server.process.wait(timeout=10.0)
    deadline = time.monotonic() + 10.0
    while server.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.ready()
    left, right = socket.socketpair()
    try:
        with pytest.raises(forkserver.ForkServerError):
            server.spawn(
                forkserver.Request(
                    module="json", argv=(), env={}, cwd=str(tmp_path), exit_file="x"
                ),
                left.fileno(),
            )
    finally:
        left.close()
        right.close()
