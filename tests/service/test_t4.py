"""The seed's T4 example through the real HTTP API on a loopback port: two 6 GiB deployments
share the 16 GiB card, the third is refused with insufficient_capacity, and once one stops
the third fits. The engine runtime is the in-process double (no GPU here)."""

from __future__ import annotations

from pathlib import Path

import httpx

from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import (
    deploy,
    register_tiny_gguf,
    serving,
    settings_for,
    wait_status,
)

SIX_GIB = 6 * GIB


def test_seed_t4_example(tmp_path: Path, database_url: str) -> None:
    runtime = ScriptedRuntime()
    with (
        serving(settings_for(tmp_path, database_url), runtime) as api,
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        model = register_tiny_gguf(client, tmp_path)
        ids = []
        for _ in range(3):
            response = deploy(client, model["id"], vram_allocation=SIX_GIB)
            assert response.status_code == 202, response.text
            ids.append(response.json())
        a, b, c = (wait_status(client, i) for i in ids)

        for record in (a, b):
            assert record["status"] == "DEPLOYED"
            assert (record["node_name"], record["gpu_index"]) == ("node-a", 0)
            assert record["allocated_capacity_gb"] == 6
            assert record["allocated_bytes"] == SIX_GIB
            assert record["hardware_class"] == "software_shared"
            assert record["sharing_class"] == "fractional"
            assert record["topology"] == "standalone_cluster"
            assert (record["gpu_vendor"], record["gpu_id"]) == ("nvidia", "GPU-t4-0")
            # vLLM's fraction means nothing to llama.cpp (these are llama.cpp engines)
            assert (record["engine_name"], record["gpu_memory_utilization"]) == ("llamacpp", None)
            assert (record["tensor_parallel_size"], record["sub_mode"]) == (1, None)
            assert record["notices"] == []
            assert record["health_details"] == {
                "probes": {"readiness": "passing"},
                "patterns": {},
                "restarts": 0,
                "notices": [],
            }
            assert record["spawner_process"] is None  # the scripted runtime runs no process
            assert record["instances"][0]["status"] == "DEPLOYED"
        assert c["status"] == "FAILED"
        assert c["last_error_code"] == "NoFitError"
        assert c["last_error_message"].startswith(
            "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory (largest free 4 GiB"
        )
        assert c["last_error_at"] is not None
        assert c["no_fit"]["reason"] == "insufficient_capacity"
        assert c["no_fit"]["largest_free_bytes"] == 4 * GIB
        assert c["node_name"] is None and c["instances"] == []
        assert len(runtime.starts) == 2  # nothing was started for the third

        slots = client.get("/cluster/hardware").json()[0]["slots"]
        assert slots[0]["reserved_bytes"] == 12 * GIB

        assert client.delete(f"/serving/deployment/{a['id']}").json() is True
        assert client.get(f"/serving/deployment/{a['id']}/status").json() == "STOPPED"
        assert runtime.stops == [a["id"]]  # stopped before the answer, once
        assert client.get("/cluster/hardware").json()[0]["slots"][0]["reserved_bytes"] == SIX_GIB

        again = deploy(client, model["id"], vram_allocation=SIX_GIB).json()
        record = wait_status(client, again)
        assert record["status"] == "DEPLOYED"
        assert (record["node_name"], record["gpu_index"]) == ("node-a", 0)
