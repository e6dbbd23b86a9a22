"""The warm tier end to end: a scale-to-zero vLLM deployment on an NVIDIA GPU sleeps when
idle instead of unloading, wakes on demand in its own process, and is started again inside
its budget when a wake fails.

The real reconciler thread, LocalRuntime and SQLite ledger; the engine is
tests/fixtures/runtime/fake_vllm.py first on PATH — a boundary double fed by vLLM's source
(the sleep routes of vllm/entrypoints/serve/sleep/api_router.py behind
VLLM_SERVER_DEV_MODE, the paused scheduler of vllm/v1/engine/core.py), since no GPU is here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.spawner import LocalRuntime
from cohabit.service.control.admission import DeployRequest, admit
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.control.warm import residue_bytes
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord, DeploymentStatus, Scaling
from cohabit.units import GIB
from tests.e2e.engines import kill_engines
from tests.estimate.tinymodels import write_safetensors_model
from tests.runtime.conftest import fail_wake_file, fake_vllm_on_path
from tests.service.server import serving as app_serving
from tests.service.server import settings_for, wait_status

S = DeploymentStatus
T = TypeVar("T")
# One 16 GiB NVIDIA card on a node with 32 GiB of host memory (24 GiB for sleepers'
# weights once the OS's 8 GiB are kept): vLLM runs there and level 1 has room.
FLEET = Fleet(
    nodes=(
        Node(
            name="node-a",
            memory_bytes=32 * GIB,
            gpus=(
                Gpu(
                    index=0,
                    vendor=Vendor.NVIDIA,
                    product="Tesla T4",
                    memory_bytes=16 * GIB,
                    accel_version="12.4",
                    uuid="GPU-t4-0",
                ),
            ),
        ),
    )
)


def eventually(check: Callable[[], T | None], *, timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while (result := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {check}"
        time.sleep(0.05)
    return result


@pytest.fixture
def reconciler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reconciler]:
    fake_vllm_on_path(tmp_path, monkeypatch)
    db = Database(f"sqlite:///{tmp_path / 'cohabit.db'}")
    db.migrate()
    ledger.save_fleet(db, FLEET)
    runtime = LocalRuntime(tmp_path / "data", stop_grace_s=3.0)
    driver = Reconciler(db, runtime, poll_interval_s=0.1, lease_s=5.0, idle_sleep=True)
    driver.start()
    try:
        yield driver
    finally:
        driver.stop()
        kill_engines(tmp_path / "data")
        db.dispose()


def deploy(
    db: Database,
    tmp_path: Path,
    name: str = "tiny",
    vram_bytes: int | None = None,
    keep_alive_s: int = 1,
) -> str:
    """The tiny safetensors model on vLLM, scaling to zero after `keep_alive_s`: sized by
    admission, or given `vram_bytes` (no estimate: it then sleeps at level 2)."""
    model_dir = tmp_path / name
    write_safetensors_model(model_dir)
    model = register_model(db, Registration(name=name, path=str(model_dir)))
    request = DeployRequest(
        model_id=model.id,
        config_id=None,
        file_id=None,
        engine_name="vllm",
        vram_allocation=vram_bytes,
        force_cpu=False,
        body={},
        scaling=Scaling(min_copies=0, keep_alive_s=keep_alive_s),
    )
    return admit(db, request).id


def awake_and_serving(db: Database, deployment_id: str) -> DeploymentRecord | None:
    record = deployments.get(db, deployment_id)
    assert record.status in {S.REQUESTED, S.DEPLOYING, S.INITIALIZING, S.DEPLOYED}, (
        record.last_error_message
    )
    awake = record.status is S.DEPLOYED and record.sleep_level is None
    return record if awake and record.engine_handle else None


def asleep(db: Database, deployment_id: str) -> DeploymentRecord | None:
    record = deployments.get(db, deployment_id)
    assert record.status is S.DEPLOYED, record.last_error_message
    settled = any(r.asleep for r in ledger.current_state(db).reservations)
    return record if record.sleep_level is not None and settled else None


def engine_url(record: DeploymentRecord) -> str:
    handle = handle_from_json(record.engine_handle)
    assert handle is not None and handle.base_url
    return handle.base_url


def chat(record: DeploymentRecord) -> str:
    body = {"model": record.model_name, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(
        f"{engine_url(record)}/v1/chat/completions", json=body, timeout=30, trust_env=False
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in events.since(db, deployment_id)]


def test_an_idle_vllm_copy_sleeps_then_wakes_in_its_own_process(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    db, activity = reconciler.db, reconciler.activity
    deployment_id = deploy(db, tmp_path)
    activity.begin(deployment_id)
    reconciler.wake()
    record = eventually(lambda: awake_and_serving(db, deployment_id))
    assert chat(record) == "hello"
    budget = record.placement.allocated_bytes if record.placement else 0
    activity.finish(deployment_id, seconds=0.1, ok=True)

    slept = eventually(lambda: asleep(db, deployment_id))
    assert slept.engine_handle == record.engine_handle  # the same engine, kept
    assert httpx.get(f"{engine_url(slept)}/is_sleeping", trust_env=False).json() == {
        "is_sleeping": True
    }
    (held,) = ledger.current_state(db).reservations
    assert (held.reserved_bytes, held.budget_bytes) == (residue_bytes(slept), budget)
    assert held.host_bytes > 0  # level 1: the weights wait in host memory
    assert deployments.serving(db, "tiny")  # still listed and routable
    slept_event = [e for e in events.since(db, deployment_id) if e.kind == "slept"][-1]
    assert slept_event.message.startswith("asleep at level 1 (idle for ")

    activity.hold(deployment_id)  # a request held for it, as the gateway holds one
    reconciler.load(deployment_id)  # the gateway's ask (the loop may have woken it first)
    woken = eventually(lambda: awake_and_serving(db, deployment_id))
    assert woken.engine_handle == record.engine_handle
    (held,) = ledger.current_state(db).reservations
    assert (held.reserved_bytes, held.budget_bytes, held.host_bytes) == (budget, None, 0)
    assert chat(woken) == "hello"
    assert eventually(lambda: kinds(db, deployment_id)[-1] == "woke" or None)
    assert "unloaded" not in kinds(db, deployment_id)
    activity.release(deployment_id)


def test_a_copy_that_fails_to_wake_starts_again_in_its_budget(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    db, activity = reconciler.db, reconciler.activity
    deployment_id = deploy(db, tmp_path)
    activity.begin(deployment_id)
    reconciler.wake()
    first = eventually(lambda: awake_and_serving(db, deployment_id))
    budget = first.placement.allocated_bytes if first.placement else 0
    activity.finish(deployment_id, seconds=0.1, ok=True)
    eventually(lambda: asleep(db, deployment_id))

    fail_wake_file(tmp_path / "vllm-launch.json").touch()  # its next wake fails
    activity.hold(deployment_id)
    reconciler.load(deployment_id)  # the gateway's ask (the loop may have tried first)

    def restarted() -> str | None:
        found = [e for e in events.since(db, deployment_id) if e.kind == "restarted"]
        return found[-1].message if found else None

    message = eventually(restarted)
    assert message.startswith("waking failed (") and "CUDA error: out of memory" in message

    def on_a_new_engine() -> DeploymentRecord | None:
        record = awake_and_serving(db, deployment_id)
        return record if record and record.engine_handle != first.engine_handle else None

    assert chat(eventually(on_a_new_engine)) == "hello"
    assert [r.reserved_bytes for r in ledger.current_state(db).reservations] == [budget]
    activity.release(deployment_id)


def test_a_wake_that_does_not_fit_waits_until_room_comes(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    """Two 10 GiB deployments on a 16 GiB card: the second fits only while the first sleeps,
    the first's wake is refused while the second serves (nothing over-committed), and it
    wakes by itself once the second has gone to sleep in turn."""
    db, activity = reconciler.db, reconciler.activity
    first = deploy(db, tmp_path, "first", 10 * GIB)
    activity.begin(first)
    reconciler.wake()
    eventually(lambda: awake_and_serving(db, first))
    activity.finish(first, seconds=0.1, ok=True)
    eventually(lambda: asleep(db, first))

    second = deploy(db, tmp_path, "second", 10 * GIB)
    activity.begin(second)  # serving a request: it stays awake
    eventually(lambda: awake_and_serving(db, second))
    activity.hold(first)  # a request for the first is held
    assert reconciler.load(first) is False  # its budget does not fit beside the second
    assert deployments.get(db, first).sleep_level is not None
    used = ledger.current_state(db).used_bytes()
    assert sum(used.values()) <= 16 * GIB

    activity.finish(second, seconds=0.1, ok=True)  # idle: the second sleeps, the first wakes
    woken = eventually(lambda: awake_and_serving(db, first))
    assert chat(woken) == "hello"  # woken from level 2: its weights were read again
    assert deployments.get(db, second).sleep_level is not None
    activity.release(first)


def test_room_for_a_new_deployment_is_made_by_sleeping_an_idle_copy(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    """A 10 GiB copy idle but inside its keep-alive holds the 16 GiB card; a second 10 GiB
    deployment of the same priority does not fit beside it. Preemption puts the idle one to
    sleep rather than unloading it, and the second is placed in the room that frees."""
    db, activity = reconciler.db, reconciler.activity
    first = deploy(db, tmp_path, "first", 10 * GIB, keep_alive_s=3600)
    activity.begin(first)
    reconciler.wake()
    eventually(lambda: awake_and_serving(db, first))
    activity.finish(first, seconds=0.1, ok=True)

    second = deploy(db, tmp_path, "second", 10 * GIB, keep_alive_s=3600)
    eventually(lambda: awake_and_serving(db, second))
    slept = deployments.get(db, first)
    assert slept.status is S.DEPLOYED and slept.sleep_level is not None
    message = [e for e in events.since(db, first) if e.kind == "slept"][-1].message
    assert "(preempted by second (priority 0))" in message
    placed = [e for e in events.since(db, second) if e.kind == "placed"][-1].message
    assert "after putting first to sleep" in placed
    assert sum(ledger.current_state(db).used_bytes().values()) <= 16 * GIB


def test_a_request_through_the_gateway_wakes_a_sleeping_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole server: the gateway holds the request while the loop wakes the engine, as
    it does for a load, and the answer comes from the engine that slept."""
    fake_vllm_on_path(tmp_path, monkeypatch)
    model_dir = tmp_path / "tiny-llama"
    write_safetensors_model(model_dir)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}", idle_sleep=True)
    runtime = LocalRuntime(tmp_path / "data", stop_grace_s=3.0)
    chat_body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    try:
        with (
            app_serving(settings, runtime, fleet=FLEET) as api,
            httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
        ):
            model = client.post("/models/", json={"name": "tiny", "path": str(model_dir)})
            assert model.status_code == 201, model.text
            body = {"m_id": model.json()["id"], "engine_name": "vllm"}
            deployed = client.post(
                "/serving/deploy_model", json={**body, "min_copies": 0, "keep_alive": 1}
            )
            assert deployed.status_code == 202, deployed.text
            deployment_id = deployed.json()
            wait_status(client, deployment_id, {"DEPLOYED"})
            gateway = f"{api.removesuffix('/api')}/v1/chat/completions"
            first = httpx.post(gateway, json=chat_body, timeout=60, trust_env=False)
            assert first.status_code == 200, first.text

            def seen(kind: str) -> list[str] | None:
                found = client.get(f"/serving/deployment/{deployment_id}/events").json()
                kinds = [event["kind"] for event in found["events"]]
                return kinds if kind in kinds else None

            eventually(lambda: seen("slept"))
            again = httpx.post(gateway, json=chat_body, timeout=60, trust_env=False)
            assert again.status_code == 200, again.text
            assert again.json()["choices"][0]["message"]["content"] == "hello"
            # The wake is recorded as the engine answers: the event may come a moment after.
            assert "unloaded" not in eventually(lambda: seen("woke"))
    finally:
        kill_engines(tmp_path / "data")
