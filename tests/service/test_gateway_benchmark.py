"""The gateway benchmark (benchmarks/gateway.py) runs end to end at a tiny scale: `cohabit
serve` in its own process, a real llama.cpp engine (llama-cpp-python's server on the CPU
with the tiny GGUF) started by a cold request that the gateway holds until it serves, then
one-token chat completions direct, per deployment and by name, all answered, and the figures
printed as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_the_benchmark_runs_at_a_tiny_scale() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/gateway.py", "--requests", "5"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures["routes"]) == {"direct", "deployment", "by_name"}
    for name, route in figures["routes"].items():
        assert route["requests"] == 5, name
        assert 0 < route["p50_ms"] <= route["p99_ms"], name
    for name in ("deployment", "by_name"):
        added = figures["added"][name]["p50_ms"]
        assert added == round(
            figures["routes"][name]["p50_ms"] - figures["routes"]["direct"]["p50_ms"], 3
        )
        assert isinstance(figures["server_cpu_ms_per_request"][name], float)
    cold = figures["cold_start"]
    assert cold["engine_start_s"] > 0 and cold["control_plane_before_engine_s"] > 0
    parts = (
        cold["control_plane_before_engine_s"]
        + cold["engine_start_s"]
        + cold["control_plane_after_engine_s"]
    )
    assert abs(parts - cold["to_first_chunk_s"]) < 0.01
    after = cold["ready_to_deployed_s"] + cold["deployed_to_first_chunk_s"]
    assert abs(after - cold["control_plane_after_engine_s"]) < 0.01
    assert figures["cold_start_from"] == "a request to an unloaded deployment"
    assert "cold start" in result.stdout and "gateway (by_name) adds" in result.stdout
