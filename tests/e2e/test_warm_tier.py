"""The warm tier end to end: a scale-to-zero vLLM deployment on an NVIDIA GPU sleeps when
idle instead of unloading, wakes on demand in its own process, and is started again inside
its budget when a wake fails.

The real reconciler thread, LocalRuntime and SQLite ledger; the engine is
tests/fixtures/runtime/fake_vllm.py first on PATH — a boundary double fed by vLLM's source
(the sleep routes of vllm/entrypoints/serve/sleep/api_router.py behind
VLLM_SERVER_DEV_MODE, the paused scheduler of vllm/v1/engine/core.py), since no GPU is here.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import pynvml
import pytest

from cohabit.estimate.engines import CUDA_CONTEXT_BYTES, VLLM_NON_TORCH_BYTES
from cohabit.hardware.model import Fleet, GpuProcess, Node
from cohabit.hardware.usage import DeviceUsage, nvidia_usage
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.spawner import LocalRuntime
from cohabit.service.control.admission import DeployRequest, admit
from cohabit.service.control.autoscale import ScalePolicy
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.control.warm import residue_bytes
from cohabit.service.registry.catalog import Registration, register_model
from cohabit.service.telemetry.meter import Measure, Meter
from cohabit.store import copyset, deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord, DeploymentStatus, Scaling
from cohabit.units import GIB
from tests.e2e.engines import eventually, kill_engines, running_reconciler
from tests.estimate.tinymodels import write_safetensors_model
from tests.hardware.test_usage import recorded_nvml
from tests.placement.fleets import fleet, gpu, node
from tests.runtime.conftest import fail_wake_file, fake_vllm_on_path
from tests.service.server import serving as app_serving
from tests.service.server import settings_for, wait_status
from tests.service.test_meter_gpu import H100_MIG

S = DeploymentStatus
T = TypeVar("T")
# One 16 GiB NVIDIA card on a node with 32 GiB of host memory (24 GiB for sleepers'
# weights once the OS's 8 GiB are kept): vLLM runs there and level 1 has room.
FLEET = fleet(
    node("node-a", gpu(0, 16, product="Tesla T4", uuid="GPU-t4-0"), memory_bytes=32 * GIB)
)


@contextlib.contextmanager
def running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fleet: Fleet = FLEET
) -> Iterator[Reconciler]:
    """The reconciler's thread on a SQLite ledger holding `fleet`, vLLM's stand-in on PATH,
    idle vLLM copies put to sleep."""
    fake_vllm_on_path(tmp_path, monkeypatch)
    with running_reconciler(tmp_path, fleet, idle_sleep=True) as driver:
        yield driver


@pytest.fixture
def reconciler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reconciler]:
    with running(tmp_path, monkeypatch) as driver:
        yield driver


def small_cards(host_bytes: int, gpus: int = 1) -> Fleet:
    """A node of `gpus` 3 GiB NVIDIA cards and `host_bytes` of host memory."""
    cards = tuple(
        gpu(i, 3, product="NVIDIA GeForce GTX 1060 3GB", uuid=f"GPU-1060-{i}") for i in range(gpus)
    )
    return Fleet(nodes=(Node(name="node-a", memory_bytes=host_bytes, gpus=cards),))


def deploy(
    db: Database,
    tmp_path: Path,
    name: str = "tiny",
    vram_bytes: int | None = None,
    keep_alive_s: int = 1,
    priority: int = 0,
) -> str:
    """The tiny safetensors model on vLLM, scaling to zero after `keep_alive_s`: sized by
    admission, or given `vram_bytes` (no estimate: it then sleeps at level 2)."""
    model_dir = tmp_path / name
    write_safetensors_model(model_dir)
    scaling = Scaling(min_copies=0, keep_alive_s=keep_alive_s, priority=priority)
    return admit_on_vllm(db, model_dir, scaling, vram_bytes=vram_bytes)


def admit_on_vllm(
    db: Database, model_dir: Path, scaling: Scaling, *, vram_bytes: int | None = None
) -> str:
    """The model in `model_dir`, registered under its folder's name, admitted on vLLM."""
    model = register_model(db, Registration(name=model_dir.name, path=str(model_dir)))
    request = DeployRequest(
        model_id=model.id,
        config_id=None,
        file_id=None,
        engine_name="vllm",
        vram_allocation=vram_bytes,
        force_cpu=False,
        body={},
        scaling=scaling,
    )
    return admit(db, request).id


def deploy_sized(
    db: Database, tmp_path: Path, name: str, *, copies: int = 1, keep_alive_s: int = 3600
) -> str:
    """The tiny model with 1 GiB more of weights in a sparse shard (a hole on disk that
    reads as zeros; the stand-in reads none of it), sized by admission: 1.77 GiB with vLLM's
    overhead, of which the 0.76 GiB overhead stays on the card asleep. Scales to zero;
    kept loaded for `keep_alive_s` unless put away for room; `copies` start together."""
    model_dir = tmp_path / name
    write_safetensors_model(model_dir)
    header = json.dumps(
        {"model.extra_buffer": {"dtype": "F16", "shape": [GIB // 2], "data_offsets": [0, GIB]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    with (model_dir / "model-extra.safetensors").open("wb") as shard:
        shard.write(struct.pack("<Q", len(header)) + header)
        shard.truncate(8 + len(header) + GIB)
    scaling = Scaling(
        min_copies=0, keep_alive_s=keep_alive_s, starting_copies=copies, max_copies=copies
    )
    return admit_on_vllm(db, model_dir, scaling)


def asleep_alone(db: Database, deployment_id: str) -> DeploymentRecord | None:
    """The copy once it sleeps and its own reservation holds only its residue."""
    record = deployments.get(db, deployment_id)
    assert record.status is S.DEPLOYED, record.last_error_message
    held = [r for r in ledger.current_state(db).reservations if r.deployment == deployment_id]
    settled = bool(held) and all(r.asleep for r in held)
    return record if record.sleep_level is not None and settled else None


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


def serving_a_request(reconciler: Reconciler, tmp_path: Path) -> DeploymentRecord:
    """The tiny model deployed (`deploy`) and serving, one request in flight through it: the
    caller ends that request (`activity.finish`) to let it go idle."""
    deployment_id = deploy(reconciler.db, tmp_path)
    reconciler.activity.begin(deployment_id)
    reconciler.wake()
    return eventually(lambda: awake_and_serving(reconciler.db, deployment_id))


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in events.since(db, deployment_id)]


def test_an_idle_vllm_copy_sleeps_then_wakes_in_its_own_process(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    db, activity = reconciler.db, reconciler.activity
    record = serving_a_request(reconciler, tmp_path)
    deployment_id = record.id
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
    first = serving_a_request(reconciler, tmp_path)
    deployment_id = first.id
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


def last_message(db: Database, deployment_id: str, kind: str) -> str:
    return [e for e in events.since(db, deployment_id) if e.kind == kind][-1].message


@pytest.mark.parametrize(
    ("host_bytes", "level"),
    [(32 * GIB, 1), (9 * GIB, 2)],
    ids=["the-host-takes-the-weights", "the-host-cannot"],
)
def test_two_models_alternate_on_a_card_that_holds_one_awake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_bytes: int, level: int
) -> None:
    """Two 1.77 GiB models on a 3 GiB card: one awake and one asleep (its 0.76 GiB residue)
    fit, two awake do not. Each request wakes its model, which puts the other — idle, of the
    same priority, scaling to zero — to sleep to take its budget back: at level 1 while the
    host's memory less the OS's 8 GiB can take the other's 1 GiB of weights, else at level 2
    (its weights read again when it wakes). The card is never over-committed."""
    with running(tmp_path, monkeypatch, small_cards(host_bytes)) as reconciler:
        db, activity = reconciler.db, reconciler.activity
        first = deploy_sized(db, tmp_path, "first")
        activity.begin(first)
        reconciler.wake()
        eventually(lambda: awake_and_serving(db, first))
        activity.finish(first, seconds=0.1, ok=True)
        second = deploy_sized(db, tmp_path, "second")
        eventually(lambda: awake_and_serving(db, second))  # placed once the first slept
        assert eventually(lambda: asleep_alone(db, first)).sleep_level == level

        names = {first: "first", second: "second"}
        for wanted, other in [(first, second), (second, first)] * 2:
            activity.hold(wanted)  # a request for it, held as the gateway holds one
            reconciler.load(wanted)  # the gateway's ask (the loop may have woken it first)
            woken = eventually(lambda wanted=wanted: awake_and_serving(db, wanted))
            assert chat(woken) == "hello"  # its weights are there, read again at level 2
            slept = eventually(lambda other=other: asleep_alone(db, other))
            assert slept.sleep_level == level
            assert sum(ledger.current_state(db).used_bytes().values()) <= 3 * GIB
            woke = eventually(
                lambda wanted=wanted: (
                    (kinds(db, wanted)[-1] == "woke" or None) and last_message(db, wanted, "woke")
                )
            )
            assert woke == (
                f"awake from level {level}: a request needs it, "
                f"after putting {names[other]} to sleep"
            )
            assert f"(preempted by {names[wanted]} (priority 0))" in last_message(
                db, other, "slept"
            )
            activity.release(wanted)
        assert "unloaded" not in kinds(db, first) + kinds(db, second)


def test_a_wake_unloads_an_idle_copy_that_cannot_sleep(
    reconciler: Reconciler, tmp_path: Path
) -> None:
    """A sleeper of priority 1 finds its card taken by an idle deployment of priority 0
    that keeps a copy loaded (`min_copies: 1`): it cannot sleep, and preemption's rule lets
    a lower priority go. The wake unloads it, as a load of priority 1 would."""
    db, activity = reconciler.db, reconciler.activity
    first = deploy(db, tmp_path, "first", 10 * GIB, priority=1)
    activity.begin(first)
    reconciler.wake()
    eventually(lambda: awake_and_serving(db, first))
    activity.finish(first, seconds=0.1, ok=True)
    eventually(lambda: asleep_alone(db, first))

    model_dir = tmp_path / "low"
    write_safetensors_model(model_dir)
    model = register_model(db, Registration(name="low", path=str(model_dir)))
    low = admit(
        db,
        DeployRequest(
            model_id=model.id,
            config_id=None,
            file_id=None,
            engine_name="vllm",
            vram_allocation=10 * GIB,
            force_cpu=False,
            body={},
            scaling=Scaling(min_copies=1),
        ),
    ).id
    eventually(lambda: awake_and_serving(db, low))

    activity.hold(first)
    reconciler.load(first)
    woken = eventually(lambda: awake_and_serving(db, first))
    assert chat(woken) == "hello"
    assert deployments.get(db, low).status is S.UNLOADED
    assert last_message(db, first, "woke").startswith(
        "awake from level 2: a request needs it, after unloading low (priority 0, idle "
    )
    assert sum(ledger.current_state(db).used_bytes().values()) <= 16 * GIB
    activity.release(first)


def copies_now(db: Database, deployment_id: str) -> list[DeploymentRecord]:
    return deployments.copies_of(db, deployment_id)


def test_each_copy_sleeps_on_its_own_and_wakes_when_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two copies of a 1.77 GiB model, one on each 3 GiB card, on a host whose memory less
    the OS's 8 GiB holds one copy's 1 GiB of weights. Idle, each copy sleeps in its own
    process with its own residue: copy 0 first, at level 1, then copy 1 at level 2, the host
    memory being taken. A request wakes copy 0 alone; copy 1 sleeps on until the load asks
    for a second copy, when autoscaling wakes it rather than placing a new one."""
    with running(tmp_path, monkeypatch, small_cards(int(9.5 * GIB), gpus=2)) as reconciler:
        db, activity = reconciler.db, reconciler.activity
        deployment_id = deploy_sized(db, tmp_path, "tiny", copies=2, keep_alive_s=1)
        activity.begin(deployment_id)  # busy until both serve
        reconciler.wake()

        def all_serving() -> list[DeploymentRecord] | None:
            found = [awake_and_serving(db, c.id) for c in copies_now(db, deployment_id)]
            serving = [record for record in found if record is not None]
            return serving if len(serving) == 2 else None

        serving = eventually(all_serving)
        activity.finish(deployment_id, seconds=0.1, ok=True)

        def all_asleep() -> list[DeploymentRecord] | None:
            found = [asleep_alone(db, c.id) for c in copies_now(db, deployment_id)]
            asleep = [record for record in found if record is not None]
            return asleep if len(asleep) == len(found) else None

        slept = eventually(all_asleep)
        assert [c.sleep_level for c in slept] == [1, 2]
        assert [c.engine_handle for c in slept] == [c.engine_handle for c in serving]
        held = {r.deployment: r for r in ledger.current_state(db).reservations}
        for copy in slept:
            assert held[copy.id].reserved_bytes == residue_bytes(copy)
            assert held[copy.id].budget_bytes == copy.requested_bytes
        assert [held[c.id].host_bytes > 0 for c in slept] == [True, False]
        assert [last_message(db, c.id, "slept")[:18] for c in slept] == [
            "asleep at level 1 ",
            "asleep at level 2 ",
        ]

        activity.hold(deployment_id)  # a request for the deployment: copy 0 wakes
        reconciler.load(deployment_id)
        woken = eventually(lambda: awake_and_serving(db, deployment_id))
        assert chat(woken) == "hello"
        activity.release(deployment_id)
        time.sleep(0.5)  # a few passes: copy 1 is not woken for it
        copy_1 = copies_now(db, deployment_id)[1]
        assert copy_1.sleep_level == 2 and copy_1.status is S.DEPLOYED

        reconciler.autoscaler.policy = ScalePolicy(per_copy=1, window_s=0.0, cooldown_s=60.0)
        for _ in range(3):
            activity.begin(deployment_id)  # 3 in flight on 1 copy, above 1 per copy
        again = eventually(lambda: awake_and_serving(db, copy_1.id))
        assert again.engine_handle == copy_1.engine_handle  # woken, not placed anew
        assert chat(again) == "hello"
        assert len(copies_now(db, deployment_id)) == 2
        assert last_message(db, deployment_id, "scaled").endswith("; copy 1 woken")
        for _ in range(3):
            activity.finish(deployment_id, seconds=0.1, ok=True)


def recorded_h100(monkeypatch: pytest.MonkeyPatch, pid: int) -> Measure:
    """NVML's recorded answers (tests/hardware/test_usage.py), the recording's engine process
    being `pid` — standing for the engine asleep: 14 GiB on the H100's 3g.40gb MIG slice,
    and a figure the driver cannot say on the L40S. The recording's second process on the
    slice is another one here."""
    recorded_nvml(monkeypatch, {"ENGINE": pid, "ENGINE_CHILD": os.getpid()})
    return lambda _fleet: nvidia_usage("node-a", nvml=pynvml)


def t4_reading(monkeypatch: pytest.MonkeyPatch, pid: int) -> Measure:
    """The T4 as NVML reports it, its one process `pid` using 12 GiB."""
    used = 12 * GIB
    reading = DeviceUsage(
        node="node-a",
        gpu_index=0,
        partition_index=None,
        total_bytes=16 * GIB,
        used_bytes=used,
        free_bytes=16 * GIB - used,
        processes=(GpuProcess(pid=pid, used_bytes=used),),
    )
    return lambda _fleet: (reading,)


ESTIMATE = CUDA_CONTEXT_BYTES + VLLM_NON_TORCH_BYTES  # no estimate: context and workspaces


@pytest.mark.parametrize(
    ("fleet", "meter", "budget_bytes", "where", "held_bytes", "said"),
    [
        (
            H100_MIG,
            recorded_h100,
            20 * GIB,
            "node-a gpu 0 mig 3g.40gb #0",
            14 * GIB,
            "measured asleep at 14 GiB: held in place of the estimate",
        ),
        (H100_MIG, recorded_h100, 42 * GIB, "node-a gpu 1", ESTIMATE, None),
        (
            FLEET,
            t4_reading,
            10 * GIB,
            "node-a gpu 0",
            10 * GIB,
            "measured asleep at 12 GiB, above its whole budget of 10 GiB: "
            "10 GiB held, its budget at most",
        ),
    ],
    ids=["measured", "the-driver-cannot-say", "above-its-budget"],
)
def test_a_metered_sleeper_holds_the_residue_the_meter_measured(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fleet: Fleet,
    meter: Callable[[pytest.MonkeyPatch, int], Measure],
    budget_bytes: int,
    where: str,
    held_bytes: int,
    said: str | None,
) -> None:
    """The sleep holds the estimate first; a meter sample taken before the sleep is not
    used; the first taken after it puts the engine's measured memory in its place, never
    more than its budget (then the timeline says why); where the driver cannot say, the
    estimate stays. A wake takes the whole budget back. (A MIG slice is reserved whole.)"""
    with running(tmp_path, monkeypatch, fleet) as reconciler:
        db, activity = reconciler.db, reconciler.activity
        deployment_id = deploy(db, tmp_path, "tiny", budget_bytes)
        activity.begin(deployment_id)
        reconciler.wake()
        record = eventually(lambda: awake_and_serving(db, deployment_id))
        (placed,) = ledger.current_state(db).reservations
        handle = handle_from_json(record.engine_handle)
        assert handle is not None and handle.pid is not None
        sampler = Meter(db, measure=meter(monkeypatch, handle.pid))
        assert sampler.latest().devices == ()
        sampler.sample()  # awake: a sample from before the sleep
        activity.finish(deployment_id, seconds=0.1, ok=True)

        eventually(lambda: asleep_alone(db, deployment_id))
        time.sleep(0.3)  # a few passes
        (held,) = ledger.current_state(db).reservations
        assert held.reserved_bytes == ESTIMATE

        snapshot = sampler.sample()
        assert [d.location for d in snapshot.devices if d.key == held.slot_key] == [where]

        def settled() -> int | None:
            (held,) = ledger.current_state(db).reservations
            return held.reserved_bytes if held.reserved_bytes == held_bytes else None

        eventually(settled, timeout_s=10)
        time.sleep(0.3)  # a few passes: it stays so
        assert settled() == held_bytes
        slept = [e.message for e in events.since(db, deployment_id) if e.kind == "slept"]
        assert slept[1:] == ([] if said is None else [said])

        activity.hold(deployment_id)
        reconciler.load(deployment_id)
        eventually(lambda: awake_and_serving(db, deployment_id))
        (held,) = ledger.current_state(db).reservations
        assert (held.reserved_bytes, held.budget_bytes) == (placed.reserved_bytes, None)
        activity.release(deployment_id)


def test_room_is_made_by_putting_one_copy_to_sleep_while_the_other_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two idle copies of a 1.77 GiB model hold the two 3 GiB cards; a third 1.77 GiB model
    fits on neither. Preemption puts one copy to sleep alone, the new model is placed on its
    card, and the other copy serves on."""
    with running(tmp_path, monkeypatch, small_cards(32 * GIB, gpus=2)) as reconciler:
        db, activity = reconciler.db, reconciler.activity
        deployment_id = deploy_sized(db, tmp_path, "tiny", copies=2)
        activity.begin(deployment_id)
        reconciler.wake()

        def both_serving() -> list[DeploymentRecord] | None:
            found = copyset.serving(copies_now(db, deployment_id))
            return found if len(found) == 2 else None

        eventually(both_serving)
        activity.finish(deployment_id, seconds=0.1, ok=True)

        other = deploy_sized(db, tmp_path, "other")
        eventually(lambda: awake_and_serving(db, other))
        copies = copies_now(db, deployment_id)
        assert [c.sleep_level is not None for c in copies].count(True) == 1
        (asleep,) = [c for c in copies if c.sleep_level is not None]
        (serving,) = copyset.serving(copies)
        assert asleep_alone(db, asleep.id) is not None
        assert chat(serving) == "hello"
        placed = last_message(db, other, "placed")
        assert "after putting tiny to sleep" in placed
        assert sum(ledger.current_state(db).used_bytes().values()) <= 6 * GIB
