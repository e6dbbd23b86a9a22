"""Each lifecycle step lands on the deployment's timeline, one reconciler pass at a time (no
HTTP; engines: the in-process double): requested → placed → reserved → started → healthy →
stopped with their details; a NoFit is `no_fit` (and not also `failed`); an engine failure
is `failed` with its code; handing deployments back at shutdown records nothing; and a
timeline that cannot be written fails no step."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from cohabit.runtime.interface import RuntimeErrorCode, handle_from_json
from cohabit.service.control import admission as service
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import deployments, events
from cohabit.store.database import Database
from cohabit.store.events import EventRecord
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.test_reconciler import admit

S = DeploymentStatus


def timeline(db: Database, deployment_id: str) -> list[EventRecord]:
    return events.since(db, deployment_id)


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in timeline(db, deployment_id)]


def test_a_deployment_placed_served_and_stopped_tells_each_step(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime(Script(ready_after_polls=2))
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    assert kinds(db, deployment_id) == ["requested"]
    for _ in range(3):
        reconciler.run_once()
    assert deployments.get(db, deployment_id).status is S.DEPLOYED
    assert service.stop(db, runtime, deployment_id, by="alice") is True
    assert service.stop(db, runtime, deployment_id, by="alice") is False  # no second event

    requested, placed, reserved, started, healthy, stopped = timeline(db, deployment_id)
    assert [e.kind for e in (requested, placed, reserved, started, healthy, stopped)] == [
        "requested", "placed", "reserved", "started", "healthy", "stopped",
    ]  # fmt: skip
    assert [e.id for e in timeline(db, deployment_id)] == sorted(
        e.id for e in timeline(db, deployment_id)
    )
    assert requested.message == (
        "tiny on llamacpp: 6 GiB per device (the vram_allocation it asked for)"
    )
    assert requested.data is not None
    assert (requested.data["engine"], requested.data["requested_bytes"]) == ("llamacpp", 6 * GIB)
    assert requested.data["source"] == "override"
    assert placed.message == (
        "on node-a gpu 0: binpack: the tightest fit, leaving 10 GiB of 16 GiB free"
    )
    assert placed.data is not None
    assert (placed.data["node"], placed.data["gpu_indices"]) == ("node-a", [0])
    assert placed.data["hardware_class"] == "software_shared"
    assert reserved.message == "holds 6 GiB on node-a gpu 0"
    assert reserved.data is not None
    assert [r["reserved_bytes"] for r in reserved.data["reservations"]] == [6 * GIB]
    handle = handle_from_json(deployments.get(db, deployment_id).engine_handle)
    assert handle is not None and started.data is not None
    assert started.data["port"] == handle.port
    assert started.message == f"llamacpp engine started: port {handle.port}"
    record = deployments.get(db, deployment_id)
    assert record.deployed_at is not None and healthy.data is not None
    waited_s = (record.deployed_at - record.requested_at).total_seconds()
    assert healthy.data["seconds_from_request"] == pytest.approx(waited_s, abs=0.002)
    phases = healthy.data["load_phases_s"]
    assert healthy.message == (
        f"serving {waited_s:.1f} s after it was requested; this load: placed in "
        f"{phases['placing']:.2f} s, its engine process started {phases['starting']:.2f} s "
        f"later and answered {phases['engine_load']:.2f} s after that"
    )
    assert stopped.message == (
        "stopped by alice through the API (was DEPLOYED); its budget is released"
    )
    assert stopped.data == {"by": "alice", "via": "api", "status_before": "DEPLOYED"}


def test_a_no_fit_is_on_the_timeline_with_its_numbers(db: Database, model_id: str) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    admit(db, model_id, 10 * GIB)
    reconciler.run_once()
    refused = admit(db, model_id, 10 * GIB)
    reconciler.run_once()

    assert kinds(db, refused) == ["requested", "no_fit"]
    no_fit = timeline(db, refused)[-1]
    assert no_fit.message.startswith("insufficient_capacity: 0/1 nodes fit")
    assert no_fit.message == deployments.get(db, refused).last_error_message
    assert no_fit.data is not None
    assert no_fit.data["reason"] == "insufficient_capacity"
    assert no_fit.data["requested_bytes"] == 10 * GIB
    assert no_fit.data["largest_free_bytes"] == 6 * GIB
    assert no_fit.data["largest_free_location"] == "node-a gpu 0"
    assert no_fit.data["status"] == "FAILED"


@pytest.mark.parametrize(
    ("script", "code", "status", "steps"),
    [
        pytest.param(
            Script(fail_code=RuntimeErrorCode.OOM, fail_message="CUDA out of memory"),
            "OOM", "FAILED", ["requested", "placed", "reserved", "started", "failed"],
            id="oom-while-starting",
        ),
        pytest.param(
            Script(fail_code=RuntimeErrorCode.CONTAINER_EXITED, fail_after_polls=2),
            "CONTAINER_EXITED", "ERROR",
            ["requested", "placed", "reserved", "started", "healthy", "failed"],
            id="died-after-serving",
        ),
        pytest.param(
            Script(start_error="no llama-server binary"), "RUNTIME_ERROR", "ERROR",
            ["requested", "placed", "reserved", "failed"],
            id="start-raises",
        ),
    ],
)  # fmt: skip
def test_a_failed_engine_is_on_the_timeline_with_its_code(
    db: Database, model_id: str, script: Script, code: str, status: str, steps: list[str]
) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(script), owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    for _ in range(3):
        reconciler.run_once()

    assert kinds(db, deployment_id) == steps
    failed = timeline(db, deployment_id)[-1]
    record = deployments.get(db, deployment_id)
    assert failed.data == {"code": code, "status": status}
    assert failed.message == f"{code}: {record.last_error_message}"


def test_handing_back_at_shutdown_is_not_a_stop(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    first = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    first.run_once()
    first.run_once()
    first.let_go()
    second = Reconciler(db, runtime, owner="two")
    second.run_once()
    second.run_once()

    assert deployments.get(db, deployment_id).status is S.DEPLOYED
    assert kinds(db, deployment_id) == ["requested", "placed", "reserved", "started", "healthy"]


def test_a_timeline_that_cannot_be_written_fails_no_step(
    db: Database, model_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The events table is gone (a real fault of the database): every step still happens,
    and each lost event is logged."""
    with db.write() as session:
        session.execute(text("DROP TABLE events"))
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    with caplog.at_level(logging.ERROR, logger="cohabit.service.control.timeline"):
        deployment_id = admit(db, model_id, 6 * GIB)
        reconciler.run_once()
        reconciler.run_once()
        assert deployments.get(db, deployment_id).status is S.DEPLOYED
        assert service.stop(db, runtime, deployment_id, by="alice") is True

    assert deployments.get(db, deployment_id).status is S.STOPPED
    lost = [r.getMessage() for r in caplog.records if "event of deployment" in r.getMessage()]
    assert [line.split(" event")[0].removeprefix("recording the ") for line in lost] == [
        "requested", "placed, reserved", "started", "healthy", "stopped",
    ]  # fmt: skip


def test_each_load_records_its_phases_on_the_timeline_and_in_metrics(
    db: Database, model_id: str
) -> None:
    """The healthy event of a deploy, and of a load on demand after an unload, carries that
    load's phases, counted from its own start (the request, then the `loading` event), and
    the reconciler's load-phase histogram counts them per engine."""
    runtime = ScriptedRuntime(Script(ready_after_polls=2))
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB, min_copies=0, keep_alive_s=-1)
    for _ in range(3):
        reconciler.run_once()
    assert reconciler.unload(deployment_id, reason="test")
    assert reconciler.load(deployment_id)
    for _ in range(3):
        reconciler.run_once()
    record = deployments.get(db, deployment_id)
    assert record.status is S.DEPLOYED and record.deployed_at is not None
    events_now = timeline(db, deployment_id)
    healthies = [e for e in events_now if e.kind == "healthy"]
    assert len(healthies) == 2
    loading = next(e for e in events_now if e.kind == "loading")
    phases = [e.data["load_phases_s"] for e in healthies if e.data is not None]
    assert [list(p) for p in phases] == [["placing", "starting", "engine_load"]] * 2
    assert all(value >= 0 for p in phases for value in p.values())
    since_loading = (record.deployed_at - loading.at).total_seconds()
    assert sum(phases[1].values()) == pytest.approx(since_loading, abs=0.005)

    (family,) = [f for f in reconciler.counters.collect() if f.name == "cohabit_load_phase_seconds"]
    counts = {
        (s.labels["engine"], s.labels["phase"]): s.value
        for s in family.samples
        if s.name == "cohabit_load_phase_seconds_count"
    }
    assert counts == {("llamacpp", phase): 2 for phase in ("placing", "starting", "engine_load")}
