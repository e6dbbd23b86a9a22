"""Scale to zero and back, and duration, one reconciler pass at a time on SQLite and
PostgreSQL: `unload` (DEPLOYED → UNLOADED, budget released, engine stopped, still listed),
`load` (UNLOADED → REQUESTED, one winner among concurrent callers, then placed and started
again), idle unloads by keep-alive, and a duration's end. Engines: the in-process double
(tests/e2e/test_scale_to_zero.py runs the same against real llama.cpp processes)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from sqlalchemy import update

from cohabit.service.control import admission as service
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import deployments, events, ledger, scaling
from cohabit.store.database import Database, utcnow
from cohabit.store.records import DeploymentStatus
from cohabit.store.tables import DeploymentRow
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.test_reconciler import admit

S = DeploymentStatus


def deployed(
    db: Database,
    reconciler: Reconciler,
    model_id: str,
    size_bytes: int = 4 * GIB,
    **fields: object,
) -> str:
    deployment_id = admit(db, model_id, size_bytes, **fields)
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.DEPLOYED
    return deployment_id


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in events.since(db, deployment_id)]


def test_unload_releases_the_budget_stops_the_engine_and_keeps_it_listed(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    assert reconciler.unload(deployment_id, reason="test") is True
    record = deployments.get(db, deployment_id)
    assert (record.status, record.placement, record.engine_handle) == (S.UNLOADED, None, None)
    assert record.claimed_by is None and record.stopped_at is None
    assert ledger.reservations(db) == []
    assert runtime.stops == [deployment_id]
    assert [r.id for r in deployments.list_active(db)] == [deployment_id]
    assert [r.id for r in deployments.serving(db, "tiny")] == [deployment_id]
    assert kinds(db, deployment_id)[-1] == "unloaded"
    assert events.since(db, deployment_id)[-1].message == "unloaded: test"
    # Not DEPLOYED any more: nothing to do. Passes leave it alone (no claim, no engine).
    assert reconciler.unload(deployment_id, reason="again") is False
    reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.UNLOADED
    assert len(runtime.starts) == 1


def test_a_request_in_flight_keeps_it_loaded(db: Database, model_id: str) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    reconciler.activity.begin(deployment_id)
    assert reconciler.unload(deployment_id, reason="test") is False
    assert deployments.get(db, deployment_id).status is S.DEPLOYED


def test_load_brings_it_back_through_placement_and_a_new_engine(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    assert reconciler.load(deployment_id) is False  # DEPLOYED: nothing to load
    reconciler.unload(deployment_id, reason="test")
    assert reconciler.load(deployment_id) is True
    assert deployments.get(db, deployment_id).status is S.REQUESTED
    assert reconciler.load(deployment_id) is False  # already on its way
    reconciler.run_once()
    reconciler.run_once()
    record = deployments.get(db, deployment_id)
    assert record.status is S.DEPLOYED and record.placement is not None
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]
    assert [launch.deployment_id for launch in runtime.starts] == [deployment_id] * 2
    # The whole story, the second start's steps after the load.
    assert kinds(db, deployment_id)[-6:] == [
        "unloaded",
        "loading",
        "placed",
        "reserved",
        "started",
        "healthy",
    ]


def test_concurrent_loads_start_one(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    reconciler.unload(deployment_id, reason="test")
    callers = 8
    barrier = threading.Barrier(callers)
    results: list[bool] = []

    def call() -> None:
        barrier.wait()
        results.append(reconciler.load(deployment_id))

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * (callers - 1) + [True]
    assert kinds(db, deployment_id).count("loading") == 1
    for _ in range(3):
        reconciler.run_once()
    assert len(runtime.starts) == 2  # the first deploy and one load


def test_starting_with_no_copy_is_admitted_unloaded(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB, min_copies=0, starting_copies=0)
    reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.UNLOADED
    assert runtime.starts == [] and ledger.reservations(db) == []
    assert reconciler.load(deployment_id) is True
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.DEPLOYED


def test_stopping_an_unloaded_deployment_ends_it(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    reconciler.unload(deployment_id, reason="test")
    assert service.stop(db, runtime, deployment_id) is True
    assert deployments.get(db, deployment_id).status is S.STOPPED
    assert reconciler.load(deployment_id) is False


def test_a_load_that_finds_no_room_stays_unloaded_with_the_reason(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, 6 * GIB, min_copies=0)
    reconciler.unload(deployment_id, reason="test")
    filler = deployed(db, reconciler, model_id, size_bytes=14 * GIB)
    reconciler.load(deployment_id)
    reconciler.run_once()
    record = deployments.get(db, deployment_id)
    assert record.status is S.UNLOADED and record.last_error_code == "NoFitError"
    assert record.no_fit is not None and record.no_fit["requested_bytes"] == 6 * GIB
    assert [r.deployment_id for r in ledger.reservations(db)] == [filler]
    assert events.since(db, deployment_id)[-1].message.startswith("no room to load it: ")


def test_an_engine_unloaded_by_another_process_is_stopped_by_its_driver(
    db: Database, model_id: str
) -> None:
    """The other process died between recording the unload and stopping the engine."""
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = deployed(db, reconciler, model_id, min_copies=0)
    assert scaling.unload(db, deployment_id) is not None
    assert runtime.stops == []
    reconciler.run_once()
    assert runtime.stops == [deployment_id]


def test_a_request_held_for_its_load_keeps_it_loaded(db: Database, model_id: str) -> None:
    """With `keep_alive: 0` it unloads the moment it is idle; a request the gateway holds for
    its load, not yet routed once it serves, is not idleness."""
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    deployment_id = admit(db, model_id, 4 * GIB, min_copies=0, keep_alive_s=0)
    reconciler.activity.hold(deployment_id)
    for _ in range(3):  # placed, serving, and one pass more
        reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.DEPLOYED
    reconciler.activity.release(deployment_id)
    reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.UNLOADED


def test_idle_deployments_unload_after_their_keep_alive(db: Database, model_id: str) -> None:
    """In flight from the moment it serves, so however long the others take to deploy on a
    loaded machine, it is kept until the request ends, then again while just used."""
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    idle = deployed(db, reconciler, model_id, min_copies=0, keep_alive_s=3)
    reconciler.activity.begin(idle)  # in flight: kept
    patient = deployed(db, reconciler, model_id, min_copies=0, keep_alive_s=60)
    never = deployed(db, reconciler, model_id, min_copies=0, keep_alive_s=-1)
    pinned = deployed(db, reconciler, model_id, min_copies=1, keep_alive_s=0)
    time.sleep(3.2)  # past its keep-alive
    reconciler.run_once()
    assert deployments.get(db, idle).status is S.DEPLOYED
    reconciler.activity.finish(idle, seconds=0.1, ok=True)  # used just now: kept
    reconciler.run_once()
    assert deployments.get(db, idle).status is S.DEPLOYED
    assert deployments.get(db, idle).last_used_at is not None  # recorded for other servers
    time.sleep(3.2)
    reconciler.run_once()
    assert deployments.get(db, idle).status is S.UNLOADED
    assert events.since(db, idle)[-1].message.startswith("unloaded: idle for ")
    for kept in (patient, never, pinned):
        assert deployments.get(db, kept).status is S.DEPLOYED
    assert runtime.stops == [idle]


def test_a_deployment_stops_when_its_duration_ends(db: Database, model_id: str) -> None:
    """A minute is too long to wait: the test moves `ends_at` into the past."""
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    timed = deployed(db, reconciler, model_id, duration_min=5)
    unloaded = deployed(db, reconciler, model_id, min_copies=0, duration_min=1)
    reconciler.unload(unloaded, reason="test")
    record = deployments.get(db, timed)
    assert record.scaling.ends_at is not None
    assert record.scaling.ends_at - record.requested_at == timedelta(minutes=5)
    reconciler.run_once()
    assert deployments.get(db, timed).status is S.DEPLOYED
    with db.write() as session:
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id.in_([timed, unloaded]))
            .values(ends_at=utcnow() - timedelta(seconds=1))
        )
    reconciler.run_once()
    for deployment_id, minutes in ((timed, 5), (unloaded, 1)):
        record = deployments.get(db, deployment_id)
        assert record.status is S.STOPPED and record.stopped_at is not None
        last = events.since(db, deployment_id)[-1]
        assert (last.kind, last.message) == (
            "stopped",
            f"stopped: its duration of {minutes} min ended",
        )
    assert ledger.reservations(db) == []
    assert runtime.stops == [unloaded, timed]
