"""LocalRuntime with real processes: fake engines (tests/fixtures/runtime/fake_engine.py) that
exit, run out of memory, never become ready, or serve /health — and the process groups,
device serialisation, adoption and logs around them. No GPU: placements are simulated."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cohabit.hardware.model import Fleet
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.engines.spec import LaunchSpec, base_url
from cohabit.runtime.errors import EngineChoiceError, LaunchError
from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    LaunchRequest,
    RuntimeErrorCode,
)
from cohabit.runtime.probe import is_ready
from cohabit.runtime.process import (
    DATA_DIR_MARK,
    DEPLOYMENT_MARK,
    RUNTIME_MARK,
    RUNTIME_NAME,
    create_time,
    free_port,
    group_alive,
    pid_reused,
    signal_group,
)
from cohabit.runtime.spawner import LocalRuntime
from cohabit.units import GIB
from tests.runtime.conftest import FAKE_ENGINE, FLEETS, fake_launcher, launch_request, wait_for

Runtimes = Callable[..., LocalRuntime]
DONE = (EngineState.READY, EngineState.FAILED)


def request_for(
    model: Path, *, deployment_id: str = "dep-1", fleet: str = "gpu16"
) -> LaunchRequest:
    return launch_request(
        fleet, 6, engine="fake", model_path=str(model), deployment_id=deployment_id
    )


@pytest.mark.parametrize(
    ("mode", "code", "message"),
    [
        pytest.param(
            "exit",
            RuntimeErrorCode.CONTAINER_EXITED,
            r"engine exited \(exit code 3\); last line: fake-engine: unrecognized arguments: "
            r"--bogus-flag",
            id="exits-at-once",
        ),
        pytest.param(
            "oom",
            RuntimeErrorCode.OOM,
            r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 2\.00 GiB\. .*"
            r"\(exit code 1\)",
            id="cuda-oom",
        ),
        pytest.param(
            "never",
            RuntimeErrorCode.STARTUP_TIMEOUT,
            r"not ready after 1\.5 s \(http://127\.0\.0\.1:\d+/health did not answer\); "
            r"last line: fake-engine: loading weights \.\.\.",
            id="never-ready",
        ),
    ],
)
def test_engine_failures(
    runtimes: Runtimes, model_file: Path, mode: str, code: RuntimeErrorCode, message: str
) -> None:
    runtime = runtimes(startup_timeout_s=1.5, launchers={"fake": fake_launcher(mode)})
    before = datetime.now(UTC)
    handle = runtime.start(request_for(model_file))
    status = wait_for(runtime, handle, *DONE)
    assert status.state is EngineState.FAILED
    assert status.error_code is code
    assert re.fullmatch(message, status.error_message or ""), status.error_message
    assert status.error_at is not None
    assert before <= status.error_at <= datetime.now(UTC)
    assert handle.pid is not None and not group_alive(handle.pid)


def test_deleted_model_file_is_must_redownload(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    model_file.unlink()
    handle = runtime.start(request_for(model_file))
    status = runtime.status(handle)
    assert status.state is EngineState.FAILED
    assert status.error_code is RuntimeErrorCode.MUST_REDOWNLOAD
    assert status.error_message == (
        f"model files missing on disk: {model_file} (download the model again)"
    )
    assert status.error_at is not None
    assert handle.pid is None  # nothing was started


def test_missing_engine_binary_is_a_runtime_error(runtimes: Runtimes, model_file: Path) -> None:
    def launch(request: LaunchRequest, port: int) -> LaunchSpec:
        url = base_url(port)
        return LaunchSpec(
            engine="fake",
            argv=("/nonexistent/llama-server",),
            port=port,
            base_url=url,
            health_url=f"{url}/health",
            startup_timeout_s=5,
        )

    runtime = runtimes(launchers={"fake": launch})
    status = runtime.status(runtime.start(request_for(model_file)))
    assert status.error_code is RuntimeErrorCode.RUNTIME_ERROR
    assert status.error_message == (
        "cannot run '/nonexistent/llama-server': No such file or directory"
    )


def test_ready_then_stop_leaves_no_process(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("serve", "--child")})
    handle = runtime.start(request_for(model_file))
    assert runtime.status(handle).state is EngineState.STARTING
    assert wait_for(runtime, handle, *DONE).state is EngineState.READY
    assert handle.base_url and is_ready(f"{handle.base_url}/health")
    assert handle.pid is not None and group_alive(handle.pid)
    runtime.stop(handle)
    assert runtime.status(handle).state is EngineState.STOPPED
    assert not group_alive(handle.pid)  # the engine and its child are gone


def test_stop_kills_an_engine_that_ignores_sigterm(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(
        stop_grace_s=0.5, launchers={"fake": fake_launcher("serve", "--child", "--ignore-term")}
    )
    handle = runtime.start(request_for(model_file))
    wait_for(runtime, handle, EngineState.READY)
    started = time.monotonic()
    runtime.stop(handle)
    assert time.monotonic() - started < 5
    assert handle.pid is not None and not group_alive(handle.pid)


def test_engine_that_dies_after_ready_is_failed(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = runtime.start(request_for(model_file))
    wait_for(runtime, handle, EngineState.READY)
    assert handle.pid is not None
    os.kill(handle.pid, signal.SIGKILL)
    status = wait_for(runtime, handle, EngineState.FAILED)
    assert status.error_code is RuntimeErrorCode.CONTAINER_EXITED
    assert status.exit_code == -signal.SIGKILL
    assert (status.error_message or "").startswith("engine exited (killed by SIGKILL)")


def test_start_is_idempotent_while_running(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    first = runtime.start(request_for(model_file))
    assert runtime.start(request_for(model_file)) == first


def _placements(fleet: Fleet, *gibs: int) -> list[Placement]:
    requests = [PlacementRequest(name=f"d{i}", vram_bytes=g * GIB) for i, g in enumerate(gibs)]
    decisions = plan_online(FleetState(fleet=fleet), requests)
    assert all(isinstance(d, Placement) for d in decisions)
    return decisions  # type: ignore[return-value]


def test_one_start_at_a_time_per_device(runtimes: Runtimes, model_file: Path) -> None:
    """d0 and d1 share GPU 0 (binpack); d2 is alone on GPU 1. d1 is held until d0 is ready."""
    runtime = runtimes(launchers={"fake": fake_launcher("serve", "--delay", "1.0")})
    placements = _placements(FLEETS["nvidia"], 50, 20, 50)
    assert [p.gpu_indices for p in placements] == [[0], [0], [1]]
    started = time.monotonic()
    handles = [
        runtime.start(
            LaunchRequest(
                deployment_id=p.name,
                engine="fake",
                model_path=str(model_file),
                served_model_name=p.name,
                placement=p,
                budget_bytes=p.allocated_bytes,
                device_total_bytes=80 * GIB,
            )
        )
        for p in placements
    ]
    first, second, third = handles
    assert first.pid is not None and third.pid is not None
    assert second.pid is None  # held: GPU 0 is busy starting d0
    assert runtime.status(second).state is EngineState.STARTING
    assert wait_for(runtime, second, *DONE).state is EngineState.READY
    # Each fake engine loads for 1 s, so d1 can only be ready this late if it waited for d0.
    assert time.monotonic() - started >= 2.0
    assert wait_for(runtime, first, *DONE).state is EngineState.READY
    assert wait_for(runtime, third, *DONE).state is EngineState.READY


def test_held_engine_starts_after_its_predecessor_fails(
    runtimes: Runtimes, model_file: Path
) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("exit"), "fake-ok": fake_launcher("serve")})
    failing = runtime.start(request_for(model_file, deployment_id="a"))
    request = request_for(model_file, deployment_id="b")
    held = runtime.start(
        LaunchRequest(
            deployment_id="b",
            engine="fake-ok",
            model_path=request.model_path,
            served_model_name="b",
            placement=request.placement,
            budget_bytes=request.budget_bytes,
            device_total_bytes=request.device_total_bytes,
        )
    )
    assert held.pid is None
    assert wait_for(runtime, failing, *DONE).state is EngineState.FAILED
    assert wait_for(runtime, held, *DONE).state is EngineState.READY


def test_adopt_after_a_restart(runtimes: Runtimes, model_file: Path) -> None:
    before = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = before.start(request_for(model_file))
    wait_for(before, handle, EngineState.READY)
    after = runtimes()  # a new control plane on the same data dir
    # A live process that is not this deployment's engine is never taken.
    assert not after.adopt(EngineHandle(deployment_id="someone-else", pid=handle.pid))
    assert not after.adopt(EngineHandle(deployment_id=handle.deployment_id, pid=os.getpid()))
    stored = EngineHandle(deployment_id=handle.deployment_id)  # even without the pid
    assert after.adopt(stored)
    assert after.status(stored).state is EngineState.READY
    after.stop(stored)
    assert handle.pid is not None and not group_alive(handle.pid)
    assert not after.adopt(stored)


def test_an_engine_whose_state_file_was_never_written_is_killed_not_adopted(
    runtimes: Runtimes, model_file: Path, tmp_path: Path
) -> None:
    """Its server was SIGKILLed between starting it and writing engine.json: found by its
    marks alone, nothing says where it listens, so adopted it would read STARTING forever
    (never ready, never timed out). It is killed instead, and the reconciler starts it again
    inside the budget the deployment holds; the sweep finds it too (were the deployment
    stopped meanwhile, no state file would name it)."""
    before = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = before.start(request_for(model_file))
    wait_for(before, handle, EngineState.READY)
    (tmp_path / "data" / "engines" / handle.deployment_id / "engine.json").unlink()
    after = runtimes()  # the next server: the record is DEPLOYING, with no handle stored
    assert [(h.deployment_id, h.pid) for h in after.engines()] == [("dep-1", handle.pid)]
    assert after.adopt(EngineHandle(deployment_id=handle.deployment_id)) is None
    assert handle.pid is not None and not group_alive(handle.pid)


def test_an_engine_found_by_marks_alone_is_killed_whatever_url_the_handle_names(
    runtimes: Runtimes, model_file: Path, tmp_path: Path
) -> None:
    """One server recorded a queued launch's handle (a port, no pid) and died; a second
    started the engine again on another port and died before recording anything, or
    before its engine.json. The third finds the engine by its marks, and the handle names
    the first launch's port, where nothing listens: adopted, it would read STARTING until
    its start-up timeout. It is killed, and started again by the caller."""
    before = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = before.start(request_for(model_file))
    wait_for(before, handle, EngineState.READY)
    (tmp_path / "data" / "engines" / handle.deployment_id / "engine.json").unlink()
    assert handle.port is not None
    queued = EngineHandle(
        deployment_id=handle.deployment_id,
        port=handle.port + 1,
        base_url=f"http://127.0.0.1:{handle.port + 1}",
    )
    after = runtimes()
    assert after.adopt(queued) is None
    assert handle.pid is not None and not group_alive(handle.pid)


def test_a_server_never_adopts_the_engine_of_another_data_dir(
    runtimes: Runtimes, model_file: Path, tmp_path: Path
) -> None:
    """Two control planes on one host, different data dirs, the same deployment id (two test
    servers, a restored database): neither takes the other's engine, by pid or by marks."""
    mine = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = mine.start(request_for(model_file))
    wait_for(mine, handle, EngineState.READY)
    other = LocalRuntime(tmp_path / "other-data")
    try:
        assert not other.adopt(EngineHandle(deployment_id=handle.deployment_id))
        assert not other.adopt(EngineHandle(deployment_id=handle.deployment_id, pid=handle.pid))
        assert other.engines() == []
        assert other.status(handle).state is EngineState.FAILED  # not its engine
    finally:
        other.stop_all()
    assert handle.pid is not None and group_alive(handle.pid)  # untouched
    again = runtimes()  # a new control plane on the engine's own data dir takes it
    assert again.adopt(EngineHandle(deployment_id=handle.deployment_id))
    assert [found.pid for found in again.engines()] == [handle.pid]


def test_an_engine_marked_before_marks_named_the_data_dir_is_taken_by_its_own(
    runtimes: Runtimes, tmp_path: Path
) -> None:
    """An engine started by an earlier version (deployment and runtime marks, no data dir
    mark), found with no recorded pid and no state file: the runtime whose engine folder it
    runs in takes it (found by its marks alone, it is killed, to be started again: see
    `test_an_engine_found_by_marks_alone_is_killed_whatever_url_the_handle_names`); no
    other runtime touches it."""
    data_dir = tmp_path / "data"
    folder = data_dir / "engines" / "dep-old"
    folder.mkdir(parents=True)
    port = free_port()
    env = {**os.environ, DEPLOYMENT_MARK: "dep-old", RUNTIME_MARK: RUNTIME_NAME}
    env.pop(DATA_DIR_MARK, None)
    engine = subprocess.Popen(
        [sys.executable, str(FAKE_ENGINE), "serve", "--port", str(port)],
        cwd=folder,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        elsewhere = LocalRuntime(tmp_path / "other-data")
        assert not elsewhere.adopt(EngineHandle(deployment_id="dep-old"))
        assert engine.poll() is None  # untouched
        own = runtimes()
        assert own.adopt(EngineHandle(deployment_id="dep-old", base_url=base_url(port))) is None
        assert engine.wait(timeout=30) is not None
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()


def test_unknown_handle_reads_as_failed(runtimes: Runtimes) -> None:
    status = runtimes().status(EngineHandle(deployment_id="never-started"))
    assert status.state is EngineState.FAILED
    assert status.error_code is RuntimeErrorCode.CONTAINER_EXITED
    assert "not started here, or not adopted" in (status.error_message or "")


def test_logs_hold_the_command_and_the_engine_lines(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("oom")})
    handle = runtime.start(request_for(model_file))
    wait_for(runtime, handle, EngineState.FAILED)
    lines = runtime.logs(handle)
    assert lines[0].startswith("[cohabit] ") and "fake_engine.py oom --port" in lines[0]
    assert lines[-1].startswith("torch.OutOfMemoryError")
    assert runtime.logs(handle, tail=1) == lines[-1:]


@pytest.mark.parametrize(
    ("request_args", "error", "message"),
    [
        pytest.param(
            {"deployment_id": "../escape"}, LaunchError, "deployment id '../escape' must be",
            id="unsafe-id",
        ),
        pytest.param(
            {"engine": "auto", "fleet": "cpu"}, EngineChoiceError,
            "no engine serves a safetensors checkpoint on host cpu pool", id="no-engine",
        ),
        pytest.param(
            {"engine": "vllm", "fleet": "apple"}, EngineChoiceError,
            "vLLM needs an NVIDIA or AMD GPU", id="vllm-on-apple",
        ),
    ],
)  # fmt: skip
def test_impossible_requests_raise_and_record_nothing(
    runtimes: Runtimes,
    tmp_path: Path,
    request_args: dict[str, str],
    error: type[Exception],
    message: str,
) -> None:
    checkpoint = tmp_path / "llama"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_bytes(b"")
    runtime = runtimes()
    request = launch_request(
        request_args.get("fleet", "gpu16"),
        6,
        engine=request_args.get("engine", "vllm"),
        model_path=str(checkpoint),
        deployment_id=request_args.get("deployment_id", "dep-1"),
    )
    with pytest.raises(error, match=re.escape(message)):
        runtime.start(request)
    status = runtime.status(EngineHandle(deployment_id=request.deployment_id))
    assert "not started here" in (status.error_message or "")


def test_error_at_is_utc_and_recent(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes(launchers={"fake": fake_launcher("exit")})
    status = wait_for(runtime, runtime.start(request_for(model_file)), EngineState.FAILED)
    assert status.error_at is not None and status.error_at.tzinfo is UTC
    assert datetime.now(UTC) - status.error_at < timedelta(seconds=30)


def test_discard_deletes_an_ended_engines_files_only(runtimes: Runtimes, model_file: Path) -> None:
    """What retention calls once a deployment's record is purged: a live engine keeps its
    directory; a stopped one's goes (logs and state file); a name that is no id is ignored."""
    runtime = runtimes(launchers={"fake": fake_launcher("serve")})
    handle = runtime.start(request_for(model_file))
    assert wait_for(runtime, handle, *DONE).state is EngineState.READY
    directory = runtime.data_dir / "engines" / handle.deployment_id
    runtime.discard(handle.deployment_id)
    assert (directory / "engine.log").is_file()
    runtime.stop(handle)
    runtime.discard(handle.deployment_id)
    assert not directory.exists()
    outside = runtime.data_dir / "keep"
    outside.mkdir()
    runtime.discard("..")
    runtime.discard("../keep")
    assert outside.is_dir()


@pytest.mark.parametrize("pgid", [-1, 0, 1])
def test_signalling_group_one_or_below_is_refused(pgid: int) -> None:
    """killpg(1) is kill(-1): as root, every process on the machine. No engine's group is 1 or
    below, so a bad pid read back from a record must never get there. (SIGCONT: should the
    guard go, the signal that reaches everything changes nothing.)"""
    with pytest.raises(ValueError, match=f"process group {pgid}"):
        signal_group(pgid, signal.SIGCONT)


def test_a_pid_taken_over_by_another_process_is_told_apart() -> None:
    """The check that keeps the spawner from killing the group of a process that took over a
    dead adopted engine's pid: the same number, another start time."""
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        started = create_time(other.pid)
        assert started is not None
        assert not pid_reused(other.pid, started)  # the process we knew
        assert pid_reused(other.pid, started - 3_600)  # an engine an hour older had it
        assert not pid_reused(other.pid, None)  # nothing recorded: nothing to tell
    finally:
        other.kill()
        other.wait()
    assert not pid_reused(other.pid, started - 3_600)  # gone: nobody holds it
