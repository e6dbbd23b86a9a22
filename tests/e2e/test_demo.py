"""`make demo`'s script, run as make runs it, with COHABIT_DEMO_EXIT=1 so it stops after
printing (stdin is a terminal here, so the variable alone ends it): two tiny models on the
simulated 16 GiB card, their placement, one reply each, the URL, and nothing left running."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

from cohabit.runtime.process import group_alive
from tests.e2e.engines import engine_pid, kill_engines

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def test_demo_deploys_two_models_prints_placement_and_replies_then_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "demo"
    terminal, other_end = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COHABIT_")}
    try:
        result = subprocess.run(
            [sys.executable, str(DEMO), "--data-dir", str(data_dir)],
            stdin=other_end,
            capture_output=True,
            text=True,
            env=env | {"COHABIT_DEMO_EXIT": "1"},
            timeout=240,
            check=False,
        )
    finally:
        os.close(terminal)
        os.close(other_end)
        kill_engines(data_dir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for name in ("tiny-a", "tiny-b"):
        assert re.search(
            rf"^{name} +DEPLOYED +demo-node +0 +software_shared/fractional +6 GiB +"
            rf"http://127\.0\.0\.1:\d+/runtime/models/[0-9a-f-]{{36}}/v1$",
            out,
            re.MULTILINE,
        ), out
        assert re.search(rf"^{name} says: '.+'$", out, re.MULTILINE), out
    assert "demo-node gpu 0: 12 GiB reserved, 4 GiB free of 16 GiB" in out
    assert re.search(r"^cohabit is running at http://127\.0\.0\.1:\d+$", out, re.MULTILINE)
    assert "demo done: stopping" in out
    assert "stopped 2 deployment(s) and the service" in out
    launched = [engine_pid(data_dir, d.name) for d in (data_dir / "engines").iterdir()]
    assert len(launched) == 2
    assert not any(pid is not None and group_alive(pid) for pid in launched)
