"""The engines a test's server started, found through the spawner's state files
(`<data_dir>/engines/<id>/engine.json`), so a test can check their process groups are gone and
kill any a failing test left behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from cohabit.runtime.process import group_alive


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
