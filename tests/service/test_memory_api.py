"""/api/cluster/memory and the reconciler's use of the meter, over real HTTP: the server's
meter reads a recorded measurement of the T4 (6 GiB held by a process outside cohabit), the
page shows it per device, and a deploy that needs more than what is really free fails with
a NoFit naming it. Engines: the in-process double (no process to meter)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import httpx

from cohabit.hardware.model import Fleet
from cohabit.hardware.usage import DeviceUsage
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    deploy,
    register_tiny_gguf,
    serving,
    settings_for,
    wait_for,
    wait_status,
)


def t4_with_a_stranger(_fleet: Fleet) -> Sequence[DeviceUsage]:
    return (
        DeviceUsage(
            node="node-a",
            gpu_index=0,
            partition_index=None,
            total_bytes=16 * GIB,
            used_bytes=6 * GIB,
            free_bytes=10 * GIB,
        ),
    )


def test_the_memory_page_and_placement_see_memory_held_outside_cohabit(
    tmp_path: Path, database_url: str
) -> None:
    settings = settings_for(tmp_path, database_url, meter_interval_s=0.2)
    with (
        serving(settings, ScriptedRuntime(), measure=t4_with_a_stranger) as api,
        httpx.Client(base_url=api, timeout=30) as http,
    ):
        report = wait_for(lambda: http.get("/cluster/memory").json()["at"] and
                          http.get("/cluster/memory").json())  # fmt: skip
        assert report["interval_s"] == 0.2 and report["headroom_bytes"] == GIB
        (device,) = report["devices"]
        assert device["location"] == "node-a gpu 0"
        assert (device["used_bytes"], device["foreign_bytes"], device["cohabit_bytes"]) == (
            6 * GIB,
            6 * GIB,
            0,
        )
        model = register_tiny_gguf(http, tmp_path)
        refused = deploy(http, model["id"], vram_allocation=12 * GIB).json()
        record = wait_status(http, refused)
        assert record["status"] == "FAILED"
        assert record["last_error_message"].endswith(
            "; 6 GiB held by processes outside cohabit on node-a gpu 0"
        )
        assert record["no_fit"]["foreign_location"] == "node-a gpu 0"
        placed = deploy(http, model["id"], vram_allocation=8 * GIB).json()
        assert wait_status(http, placed)["status"] == "DEPLOYED"
        bad = deploy(http, model["id"], vram_allocation=GIB, over_budget="later")
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["body", "over_budget"]
