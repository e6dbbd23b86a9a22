"""The engines a test's server started, found through the spawner's state files
(`<data_dir>/engines/<id>/engine.json`), so a test can check their process groups are gone and
kill any a failing test left behind; and found as the operating system sees them, by the marks
in their environment."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from pathlib import Path

import psutil

from cohabit.runtime.process import DEPLOYMENT_MARK, RUNTIME_MARK, RUNTIME_NAME, group_alive


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
        if pid is not None and group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def marked_engines(data_dir: Path) -> dict[str, list[int]]:
    """Deployment id → pids of the live engine processes (group leaders) that carry our marks
    and run in one of `data_dir`'s engine folders, read from /proc, not from our records."""
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
        deployment_id = environ.get(DEPLOYMENT_MARK)
        if environ.get(RUNTIME_MARK) == RUNTIME_NAME and deployment_id and folder.parent == engines:
            found[deployment_id].append(proc.pid)
    return dict(found)


def kill_marked(data_dir: Path) -> None:
    """SIGKILL every marked engine group of `data_dir`, recorded or not."""
    for pids in marked_engines(data_dir).values():
        for pid in pids:
            if group_alive(pid):
                os.killpg(pid, signal.SIGKILL)
