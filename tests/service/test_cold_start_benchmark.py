"""The cold-start benchmark (benchmarks/cold_start.py) runs end to end at a tiny scale: two
`cohabit serve` processes (one starting engines from its pre-imported launcher, one as fresh
processes), a bare llama-cpp-python server on the same tiny GGUF, one cold start of each per
round and swaps of two models on a card that holds one; every request answered, the phases
adding up, each load's timeline phases read back, the swaps unloading the other model each
time, and the figures printed as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


@pytest.mark.slow
def test_the_benchmark_runs_at_a_tiny_scale() -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/cold_start.py", "--rounds", "2", "--swaps", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    cold = figures["cold"]
    assert set(cold) == {"bare", "cohabit", "cohabit_fresh"}
    for side in ("cohabit", "cohabit_fresh"):
        phases = cold[side]
        assert phases["before_engine"]["min"] > 0 and phases["engine_load"]["min"] > 0
        assert phases["total"]["min"] >= phases["engine_load"]["min"]
        # Each load's own timeline: the phases it recorded, its engine's parts among them.
        for phase in ("placing", "starting", "engine_load", "engine_import", "weights_load"):
            assert phases[f"phase:{phase}"]["min"] >= 0, phase
    assert cold["bare"]["engine_load"]["min"] > 0
    assert figures["ratio_to_bare"]["bare"] == 1.0
    assert figures["swap"]["cohabit"]["min"] > 0 and figures["swap"]["bare"]["min"] > 0
    # Each swap loaded the model asked for and unloaded the other: the last one asked for
    # serves, the other is unloaded.
    assert figures["swap_states_at_end"] == {"a": "UNLOADED", "b": "DEPLOYED"}
    assert "request → first token for an unloaded model" in result.stdout
