"""Stopping a deployment whose server died (SIGKILL) kills its engine, even while the dead
server's lease still holds it: `cohabit serve` deploys the tiny model on a real llama.cpp
server (llama-cpp-python, on the CPU), is SIGKILLed, starts again on the same data dir, and
within the old lease the stop through the API ends the engine's process group before it
answers — the budget it releases is no longer in use. The lease is 10 minutes here, so the
second start is within it however long a loaded machine takes. No GPU, no network."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from cohabit.runtime.process import group_alive
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store import deployments
from cohabit.store.database import Database, sqlite_url, utcnow
from cohabit.units import GIB
from tests.cli.test_serve import T4, cohabit_serve
from tests.e2e.engines import kill_engines


@pytest.mark.slow
def test_a_stop_within_a_dead_servers_lease_kills_its_engine(tmp_path: Path) -> None:
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    data_dir = tmp_path / "data"
    lease = {"COHABIT_LEASE_S": "600"}
    try:
        with (
            cohabit_serve(tmp_path, T4, env=lease) as (api, first),
            httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
        ):
            model = client.post("/models/", json={"name": "tiny", "path": str(model_path)})
            body = {"m_id": model.json()["id"], "vram_allocation": 2 * GIB}
            deployment_id = client.post("/serving/deploy_model", json=body).json()
            deadline = time.monotonic() + 120
            while (record := client.get(f"/serving/deployment/{deployment_id}").json())[
                "status"
            ] != "DEPLOYED":
                assert record["status"] not in ("ERROR", "FAILED"), record
                assert time.monotonic() < deadline, record
                time.sleep(0.2)
            pid = int(record["instances"][0]["container_id"])
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        assert group_alive(pid)  # engines outlive their server, for the next to adopt

        with (
            cohabit_serve(tmp_path, T4, env=lease) as (api, _second),
            httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
        ):
            db = Database(sqlite_url(data_dir))
            held = deployments.get(db, deployment_id)
            db.dispose()
            assert held.claimed_until is not None and held.claimed_until > utcnow()  # the lease
            assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
            assert not group_alive(pid)  # gone before the answer, not only the row
            slots = client.get("/cluster/hardware").json()[0]["slots"]
            assert slots[0]["reserved_bytes"] == 0
    finally:
        kill_engines(data_dir)
