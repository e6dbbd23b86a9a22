"""Crash the server at random moments and check that no engine outlives its budget, and no
budget lacks its engine: 20 seeded cycles, each sending a few deploys and stops from a thread
while the server is SIGKILLed at a random moment (mid-request, mid-launch, mid-stop), then
restarting it on the same SQLite database and data dir. Once the last server has settled,
the engine processes that run — counted from /proc by the marks in their environment, not
from our records — are exactly the deployments the ledger holds budgets for, one each.

The server is the real app and the real LocalRuntime (tests/service/worker.py
--fake-engines); the engines are fake_engine.py in its `serve` mode — real processes that
answer /health within a moment, standing in for llama.cpp so that 20 restarts fit in about a
minute on two cores."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import httpx

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store import deployments
from cohabit.store.database import Database
from cohabit.store.records import ACTIVE, DeploymentStatus
from cohabit.units import GIB
from tests.e2e.engines import kill_marked, marked_engines
from tests.service.processes import check_ledger, start_worker, stop_worker
from tests.service.server import wait_for

SEED = 1130
CYCLES = 20
LEASE = ("--fake-engines", "--lease-s", "1")
S = DeploymentStatus


def act(api: str, model_id: str, live: list[str], rng: random.Random) -> None:
    """A few deploys and stops, in the order drawn; a request the kill cuts short is fine."""
    with httpx.Client(base_url=api, timeout=10, trust_env=False) as client:
        for _ in range(rng.randint(1, 3)):
            try:
                if live and (len(live) >= 6 or rng.random() < 0.4):
                    client.delete(f"/serving/deployment/{live.pop(rng.randrange(len(live)))}")
                else:
                    body = {"m_id": model_id, "vram_allocation": 2 * GIB}
                    client.post("/serving/deploy_model", json=body)
            except httpx.TransportError:
                return  # the server died under this request


def test_random_sigkills_leave_exactly_the_budgeted_engines(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    url = f"sqlite:///{tmp_path / 'cohabit.db'}"
    data_dir = tmp_path / "data"
    model = write_tiny_model(tmp_path / "serve.gguf")  # its name makes the engine serve
    db = Database(url)
    process, api = start_worker(url, data_dir, *LEASE)
    try:
        response = httpx.post(f"{api}/models/", json={"name": "serve", "path": str(model)})
        model_id = response.json()["id"]
        kills_mid_request = 0
        for _ in range(CYCLES):
            live = [r.id for r in deployments.list_all(db) if r.status in ACTIVE]
            actor = threading.Thread(target=act, args=(api, model_id, live, rng))
            actor.start()
            time.sleep(rng.uniform(0.0, 0.6))
            kills_mid_request += actor.is_alive()
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            actor.join(30)
            stop_worker(process)
            process, api = start_worker(url, data_dir, *LEASE)

        def settled() -> bool:
            records = deployments.list_all(db)
            return not any(r.status in ACTIVE - {S.DEPLOYED} for r in records)

        wait_for(settled, timeout_s=30, interval_s=0.1)
        time.sleep(0.5)  # one more pass after the last change
        state = check_ledger(db)
        budgeted = {r.deployment for r in state.reservations}
        running = marked_engines(data_dir)
        assert sorted(running) == sorted(budgeted)
        assert all(len(pids) == 1 for pids in running.values()), running
        records = deployments.list_all(db)
        assert {r.id for r in records if r.status is S.DEPLOYED} == budgeted
        assert len(records) >= CYCLES  # it did deploy, and stop, a lot
        assert any(r.status is S.STOPPED for r in records)
        assert kills_mid_request > 0  # some kills landed while requests were in flight
    finally:
        stop_worker(process)
        kill_marked(data_dir)
        db.dispose()
