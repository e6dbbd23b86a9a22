"""The engines a test's server started, found through the spawner's state files
(`<data_dir>/engines/<id>/engine.json`), so a test can check their process groups are gone and
kill any a failing test left behind; found as the operating system sees them, by the marks
in their environment; their real environment; a stand-in `llama-server`; deploying a model
file through a running server's API; and a reconciler driving real engines on its thread."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from cohabit.hardware.model import Fleet
from cohabit.runtime.process import (
    DEPLOYMENT_MARK,
    FORKED_MARK,
    RUNTIME_MARK,
    RUNTIME_NAME,
    group_alive,
)
from cohabit.runtime.spawner import LocalRuntime
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import ledger
from cohabit.store.database import Database
from tests.runtime.conftest import FAKE_ENGINE

T = TypeVar("T")


def engine_pid(data_dir: Path, deployment_id: str) -> int | None:
    """The pid (= process group) of a deployment's engine; None when none was launched."""
    state = data_dir / "engines" / deployment_id / "engine.json"
    if not state.exists():
        return None
    pid = json.loads(state.read_text()).get("pid")
    return pid if isinstance(pid, int) else None


def kill_engines(data_dir: Path) -> None:
    """SIGKILL every engine group still alive (the server leaves engines running on exit, for
    the next start to adopt)."""
    for state in (data_dir / "engines").glob("*/engine.json"):
        pid = engine_pid(data_dir, state.parent.name)
        if pid is not None and pid > 1 and group_alive(pid):  # killpg(1) would be kill(-1)
            os.killpg(pid, signal.SIGKILL)


def marked_engines(data_dir: Path) -> dict[str, list[int]]:
    """Deployment id → pids of the live engine processes (group leaders) that carry our marks
    and run in one of `data_dir`'s engine folders, read from /proc, not from our records
    (forked engines included)."""
    engines = (data_dir / "engines").resolve()
    found: dict[str, list[int]] = defaultdict(list)
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != proc.pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            environ = proc.environ()
            folder = Path(proc.cwd())
        except (psutil.Error, OSError):
            continue
        # An engine forked by a pre-imported launcher shows the launcher's environment: the
        # runtime's marks and the forked one, no deployment, which is its folder.
        forked = FORKED_MARK in environ and folder.parent == engines
        deployment_id = environ.get(DEPLOYMENT_MARK) or (folder.name if forked else None)
        if environ.get(RUNTIME_MARK) == RUNTIME_NAME and deployment_id and folder.parent == engines:
            found[deployment_id].append(proc.pid)
    return dict(found)


def kill_marked(data_dir: Path) -> None:
    """SIGKILL every marked engine group of `data_dir`, recorded or not."""
    for pids in marked_engines(data_dir).values():
        for pid in pids:
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)


def fake_llama_server(bin_dir: Path) -> Path:
    """A `llama-server` executable in `bin_dir` that becomes (exec, so same pid and the same
    environment) tests/fixtures/runtime/fake_engine.py serving /health on the --port it is
    given: with `bin_dir` first on PATH the real llama.cpp launcher starts it on a GPU fleet,
    where no real engine could run here."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "args = sys.argv[1:]\n"
        "port = args[args.index('--port') + 1]\n"
        f"engine = {str(FAKE_ENGINE)!r}\n"
        "os.execv(sys.executable, [sys.executable, engine, 'serve', '--port', port])\n"
    )
    script.chmod(0o755)
    return script


def environ_of(pid: int) -> dict[str, str]:
    """A running process's real environment, as the kernel holds it (/proc/<pid>/environ)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {key.decode(): value.decode() for key, _, value in pairs}


def deploy(client: httpx.Client, model: Path, name: str, vram_bytes: int) -> str:
    """Register `model` as `name` and deploy it with `vram_bytes` per device; its id."""
    registered = client.post("/models/", json={"name": name, "path": str(model)})
    assert registered.status_code == 201, registered.text
    body = {"m_id": registered.json()["id"], "vram_allocation": vram_bytes}
    response = client.post("/serving/deploy_model", json=body)
    assert response.status_code == 202, response.text
    deployment_id: str = response.json()
    return deployment_id


def wait_deployed(client: httpx.Client, deployment_id: str, *, timeout_s: float = 60) -> Any:
    """The deployment's record once it left the start-up states; it must be DEPLOYED."""
    deadline = time.monotonic() + timeout_s
    while (record := client.get(f"/serving/deployment/{deployment_id}").json())["status"] in (
        "REQUESTED",
        "DEPLOYING",
        "INITIALIZING",
    ):
        assert time.monotonic() < deadline, record
        time.sleep(0.1)
    assert record["status"] == "DEPLOYED", record
    return record


@contextmanager
def running_reconciler(tmp_path: Path, fleet: Fleet, **options: Any) -> Iterator[Reconciler]:
    """A reconciler (with `options` besides a fast poll) on its own thread over SQLite in
    `tmp_path`, with `fleet` saved and a real LocalRuntime; on exit it stops, and every engine
    a failure left running is killed."""
    db = Database(f"sqlite:///{tmp_path / 'cohabit.db'}")
    db.migrate()
    ledger.save_fleet(db, fleet)
    runtime = LocalRuntime(tmp_path / "data", stop_grace_s=3.0)
    driver = Reconciler(db, runtime, poll_interval_s=0.1, lease_s=5.0, **options)
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
        kill_engines(tmp_path / "data")
        db.dispose()


def eventually(check: Callable[[], T | None], *, timeout_s: float = 120.0) -> T:
    """What `check` returns once it is not None, asked every 50 ms; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (result := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        time.sleep(0.05)
    return result
