"""The API load benchmark (benchmarks/api_load.py) runs end to end at a tiny scale: its own
server process on SQLite, the stub engine, history written through the store, live
deployments through the API, every phase answered 200, and the figures printed as JSON
(latencies per route, the server's CPU time per request, the load around the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_the_benchmark_runs_at_a_tiny_scale() -> None:
    small = ["--records", "150", "--live", "3", "--models", "2", "--clients", "3"]
    result = subprocess.run(
        [sys.executable, "benchmarks/api_load.py", *small, "--duration", "1", "--think", "0.05"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["records"] == 150 and figures["live"] == 3
    assert figures["default_page"] == 100  # 3 live + the 97 newest ended
    assert len(figures["routes"]) == 5
    for name, route in figures["routes"].items():
        assert route["requests"] > 0, name
        assert 0 < route["p50_ms"] <= route["p99_ms"], name
        assert isinstance(route["server_cpu_ms"], float), name
    assert figures["load_average_start"] >= 0 and figures["server_idle_cpu_percent"] >= 0
    assert "by name adds" in result.stdout


def test_an_unknown_phase_is_refused_by_name() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/api_load.py", "--phases", "deployments,nosuch"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    assert result.returncode == 2
    assert "--phases: no phase nosuch" in result.stderr
