"""`cohabit serve`'s app moves what it holds once started out of the cyclic collector's way
(`gc.freeze`), so a full collection no longer walks every module and stalls the requests in
flight; an app made for a test (dropped again in the same process) freezes nothing. Each
case runs in its own Python process (a freeze there would outlive the test), serving real
HTTP on loopback with SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SERVE = """
import gc, sys
import httpx
from cohabit.service.app import Backend, create_app
from cohabit.service.settings import Settings
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import T4_FLEET, serving_app

data = sys.argv[1]
settings = Settings(data_dir=data, database_url=f"sqlite:///{data}/cohabit.db")
app = create_app(
    settings, Backend(runtime=ScriptedRuntime(), fleet=T4_FLEET, measure=None),
    freeze_startup=sys.argv[2] == "freeze",
)
before = gc.get_freeze_count()
with serving_app(app) as api:
    assert httpx.get(f"{api}/serving/deployments", trust_env=False).json() == []
    print(before, gc.get_freeze_count())
"""


@pytest.mark.parametrize("mode", ["freeze", "plain"])
def test_the_server_freezes_what_it_holds_once_started(tmp_path: Path, mode: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SERVE, str(tmp_path), mode],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    before, after = map(int, result.stdout.split())
    assert before == 0
    if mode == "freeze":
        assert after > 50_000  # the modules, the app and its started services
    else:
        assert after == 0
