"""Copies with real llama.cpp engines (the tiny model on llama-cpp-python's server, on the
CPU) behind the real LocalRuntime and SQLite, on a simulated fleet of two 16 GiB cards (no
GPU here: the fleet is given, the engines run on the CPU).

Driven by the reconciler's own thread: `starting_copies: 2` starts one engine per card, each
answering requests; one engine killed (SIGKILL) leaves the deployment DEPLOYED and serving
through the other while the killed copy starts again in its budget; a stop ends both process
groups and releases both budgets. Through the whole server: requests to the deployment's
model through the gateway reach both engines (each engine's own access log says so), and
with one engine killed every request still succeeds while the API shows it DEPLOYED."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.process import group_alive
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.control import admission as service
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord, DeploymentStatus
from cohabit.units import GIB
from tests.e2e.engines import eventually, kill_engines, running_reconciler
from tests.e2e.test_scale_to_zero import CHAT, chat
from tests.service.server import serving, settings_for, wait_status
from tests.service.test_reconciler import admit

S = DeploymentStatus
TWO_CARDS = Fleet(
    nodes=(
        Node(
            name="node-a",
            gpus=tuple(
                Gpu(
                    index=i,
                    vendor=Vendor.NVIDIA,
                    product="Tesla T4",
                    memory_bytes=16 * GIB,
                    accel_version="12.4",
                    uuid=f"GPU-t4-{i}",
                )
                for i in range(2)
            ),
        ),
    )
)


@pytest.fixture
def reconciler(tmp_path: Path) -> Iterator[Reconciler]:
    with running_reconciler(tmp_path, TWO_CARDS) as driver:
        yield driver


def all_serving(db: Database, deployment_id: str) -> list[DeploymentRecord] | None:
    """Every copy DEPLOYED with an engine (None while one is not); fails on an ended one."""
    copies = deployments.copies_of(db, deployment_id)
    for record in copies:
        assert record.status in {S.REQUESTED, S.DEPLOYING, S.INITIALIZING, S.DEPLOYED}, (
            record.last_error_message
        )
    ready = all(r.status is S.DEPLOYED and r.engine_handle is not None for r in copies)
    return copies if ready else None


def pid_of(record: DeploymentRecord) -> int:
    handle = handle_from_json(record.engine_handle)
    assert handle is not None and handle.pid is not None
    return handle.pid


def test_two_copies_serve_on_two_cards_and_one_killed_leaves_it_serving(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    db = reconciler.db
    model = register_model(
        db, Registration(name="tiny", path=str(write_tiny_model(tmp_path / "tiny.gguf")))
    )
    deployment_id = admit(db, model.id, 6 * GIB, starting_copies=2, max_copies=2)
    reconciler.wake()
    first, second = eventually(lambda: all_serving(db, deployment_id))
    assert {r.placement.gpu_index for r in (first, second) if r.placement} == {0, 1}
    pids = [pid_of(first), pid_of(second)]
    assert pids[0] != pids[1]
    for record in (first, second):  # each engine answers
        pid, reply = chat(record)
        assert reply and pid in pids

    os.killpg(pids[0], signal.SIGKILL)  # copy 0: the deployment's own engine
    restarted = eventually(
        lambda: [e for e in events.since(db, deployment_id) if e.kind == "restarted"] or None,
        timeout_s=30,
    )
    assert "copy 0 failed (" in restarted[0].message
    # Meanwhile the deployment is DEPLOYED and the other copy answers.
    assert deployments.get(db, deployment_id).status is S.DEPLOYED
    _, reply = chat(deployments.copies_of(db, deployment_id)[1])
    assert reply
    again = eventually(lambda: all_serving(db, deployment_id))
    new_pid = pid_of(again[0])
    assert new_pid not in pids and pid_of(again[1]) == pids[1]
    assert chat(again[0])[1]
    assert sorted(r.reserved_bytes for r in ledger.reservations(db)) == [6 * GIB, 6 * GIB]

    assert service.stop(db, reconciler.runtime, deployment_id) is True
    for pid in (new_pid, pids[1]):
        eventually(lambda pid=pid: True if not group_alive(pid) else None, timeout_s=30)
    assert ledger.reservations(db) == []
    assert {r.status for r in deployments.copies_of(db, deployment_id)} == {S.STOPPED}


def engine_requests(data_dir: Path, copy_id: str) -> int:
    """Chat completions the copy's engine answered, from its own log (uvicorn's access log)."""
    log = data_dir / "engines" / copy_id / "engine.log"
    return log.read_text(errors="replace").count('"POST /v1/chat/completions HTTP/1.1" 200')


def test_through_the_gateway_both_engines_serve_and_one_killed_leaves_it_serving(
    tmp_path: Path,
) -> None:
    database_url = f"sqlite:///{tmp_path / 'cohabit.db'}"
    settings = settings_for(tmp_path, database_url)
    runtime = LocalRuntime(settings.data_dir, stop_grace_s=3.0)
    db = Database(database_url)
    try:
        with (
            serving(settings, runtime, TWO_CARDS) as api,
            httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
        ):
            path = write_tiny_model(tmp_path / "tiny.gguf")
            model = client.post("/models/", json={"name": "tiny", "path": str(path)}).json()
            body = {"m_id": model["id"], "vram_allocation": 6 * GIB, "starting_copies": 2}
            answer = client.post("/serving/deploy_model", json=body)
            assert answer.status_code == 202, answer.text
            deployment_id = answer.json()
            wait_status(client, deployment_id, {"DEPLOYED"}, timeout_s=120)
            first, second = eventually(lambda: all_serving(db, deployment_id))
            gateway = api.removesuffix("/api") + "/v1/chat/completions"

            def ask(_: int) -> int:
                reply = httpx.post(
                    gateway, json={"model": "tiny", **CHAT}, timeout=60, trust_env=False
                )
                return reply.status_code

            asked = 0

            def both_served() -> list[int] | None:
                """Ask 8 at once; the requests each engine has seen once both have (the route
                table reads the second copy within a refresh or two, later on a loaded
                machine)."""
                nonlocal asked
                with ThreadPoolExecutor(4) as pool:
                    assert set(pool.map(ask, range(8))) == {200}
                asked += 8
                seen = [engine_requests(settings.data_dir, r.id) for r in (first, second)]
                return seen if all(count > 0 for count in seen) else None

            seen = eventually(both_served, timeout_s=30)
            assert sum(seen) == asked  # every request reached one engine, once

            os.killpg(pid_of(second), signal.SIGKILL)
            eventually(
                lambda: (
                    [e for e in events.since(db, deployment_id) if e.kind == "restarted"] or None
                ),
                timeout_s=30,
            )
            time.sleep(2 * settings.route_refresh_s)
            with ThreadPoolExecutor(4) as pool:
                assert set(pool.map(ask, range(8))) == {200}
            shown = client.get(f"/serving/deployment/{deployment_id}").json()
            assert shown["status"] == "DEPLOYED"
            eventually(lambda: all_serving(db, deployment_id))
            assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
            assert ledger.reservations(db) == []
    finally:
        kill_engines(settings.data_dir)
        db.dispose()
