"""`cohabit serve` as a user runs it (a subprocess) on the recorded mixed workstation (an 8 GB
RTX 3060 Ti on bus 01, a 24 GB RTX 3090 on bus 02, exported to a fleet file with their UUIDs),
with a stand-in `llama-server` on PATH (no GPU here: tests/e2e/engines.py), so the real
llama.cpp launcher and local runtime start real processes:

- every engine's real environment (/proc/<pid>/environ) selects the card its deployment
  reserved, by UUID, and Ctrl-C (SIGINT) on the server then leaves no engine process behind;
- with --keep-engines the engines outlive the server, and the next start adopts them: the
  deployment stays DEPLOYED on the same process and answers through the gateway; SIGTERM on
  that server then stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.hardware.fleetfile import dump_fleet
from cohabit.hardware.model import Fleet
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.runtime.process import group_alive
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.units import GIB
from tests.cli.test_serve import cohabit_serve
from tests.e2e.engines import deploy, environ_of, fake_llama_server, kill_engines, wait_deployed
from tests.hardware import fakes
from tests.runtime.cuda_order import visible_cards

WORKSTATION = "nvml_workstation_3060ti_3090.json"
RTX_3060_TI = "GPU-3c9a1f07-5b2e-8d44-0a6f-e1b27c9d4a30"
RTX_3090 = "GPU-8e41d2b6-07c3-f915-62ad-4b0e9f3c7d12"


@pytest.fixture
def fleet_text() -> str:
    """The workstation as `cohabit gpus --export` would write it (uuids and PCI addresses)."""
    node = discover_nvidia(fakes.nvml(WORKSTATION), name="ws")
    assert node is not None
    return dump_fleet(Fleet(nodes=(node,)))


@pytest.fixture
def engines_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bin_dir = tmp_path / "bin"
    fake_llama_server(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    try:
        yield tmp_path / "data"
    finally:
        kill_engines(tmp_path / "data")  # whatever a failing test left running


def deployed(client: httpx.Client, models: Path, name: str, gib: int) -> dict[str, Any]:
    """The tiny model written as `<name>.gguf`, deployed with `gib` GiB, once DEPLOYED."""
    path = write_tiny_model(models / f"{name}.gguf", seed=gib)
    return dict(wait_deployed(client, deploy(client, path, name, gib * GIB)))


def engine_pid(record: dict[str, Any]) -> int:
    return int(record["instances"][0]["container_id"])


def interrupt(process: subprocess.Popen[str]) -> int:
    """Ctrl-C: SIGINT to the server, and its exit status once it has shut down."""
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=60)


def test_engines_run_on_their_reserved_cards_and_ctrl_c_stops_them(
    tmp_path: Path, fleet_text: str, engines_on_path: Path
) -> None:
    """One server for both checks (starting one is the slow part): each engine's real
    environment names the card its deployment reserved, and Ctrl-C leaves none running."""
    models = tmp_path / "models"
    models.mkdir()
    with (
        cohabit_serve(tmp_path, fleet_text) as (api, process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        small = deployed(client, models, "small", 6)  # binpack: the 8 GB card
        large = deployed(client, models, "large", 16)  # only the 24 GB fits
        snapshot = fakes.load(WORKSTATION)
        for record, card in ((small, RTX_3060_TI), (large, RTX_3090)):
            env = environ_of(engine_pid(record))
            assert record["gpu_id"] == card
            assert env["CUDA_VISIBLE_DEVICES"] == card
            assert visible_cards(snapshot, env) == [card]
        pids = [engine_pid(record) for record in (small, large)]
        assert all(group_alive(pid) for pid in pids)
        code = interrupt(process)
    assert [pid for pid in pids if group_alive(pid)] == []
    # 130 as for any command stopped by Ctrl-C; 0 where the test runner's shell started it with
    # SIGINT ignored (background jobs), which uvicorn still catches to shut down cleanly.
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code in (0, 130), stderr
    assert "Traceback" not in stderr


def test_keep_engines_leaves_them_for_the_next_start(
    tmp_path: Path, fleet_text: str, engines_on_path: Path
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    with (
        cohabit_serve(tmp_path, fleet_text, "--keep-engines") as (api, process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        kept = deployed(client, models, "kept", 6)
        deployment_id, pid = kept["id"], engine_pid(kept)
        interrupt(process)
    assert group_alive(pid), "--keep-engines stopped the engine"
    with (
        cohabit_serve(tmp_path, fleet_text) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        # The old server handed its deployments back: this one claims them on its first
        # reconciler pass (every 0.5 s) and adopts the engine rather than starting another.
        time.sleep(2.0)
        record = wait_deployed(client, deployment_id)
        assert engine_pid(record) == pid  # adopted, not started again
        root = api.removesuffix("/api")
        answer = httpx.get(f"{root}/runtime/models/{deployment_id}/v1/models", timeout=30)
        assert answer.status_code == 200, answer.text
    # This server adopted it and was not told to keep it: SIGTERM (how cohabit_serve ends a
    # server) stopped it.
    assert not group_alive(pid)
