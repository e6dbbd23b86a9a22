"""A load's phases: the progress of a load under way read from its timeline (a table of
timelines: which phase is current, which are finished, what an earlier load or run leaves
out); the reconciler recording the engine's milestones, the phases at `healthy` and one
`first_token` per load (the in-process engine double, no HTTP); and the gateway's
first-answer marks. The real engines and HTTP: tests/e2e/test_load_phases.py,
tests/runtime/test_load_milestones.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cohabit.runtime.interface import Milestone
from cohabit.service.control import loadphases
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.telemetry.activity import Activity
from cohabit.store import deployments, events
from cohabit.store.database import Database
from cohabit.store.events import EventRecord
from cohabit.units import GIB
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.test_reconciler import admit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=10)


def timeline(*steps: tuple[str, float]) -> list[EventRecord]:
    """Events of these kinds at these seconds after T0, oldest first."""
    return [
        EventRecord(
            id=i, deployment_id="d", at=T0 + timedelta(seconds=s), kind=kind, message="", data={}
        )
        for i, (kind, s) in enumerate(steps, start=1)
    ]


DEPLOY = [("requested", 0.0), ("placed", 0.5), ("reserved", 0.5), ("started", 1.0)]


@pytest.mark.parametrize(
    ("steps", "phase", "since_s", "finished"),
    [
        pytest.param([("requested", 0.0)], "placing", 0.0, {}, id="asked"),
        pytest.param(DEPLOY[:3], "starting", 0.5, {"placing": 0.5}, id="placed"),
        pytest.param(
            DEPLOY, "engine_load", 1.0, {"placing": 0.5, "starting": 0.5},
            id="started: its parts not shown yet",
        ),
        pytest.param(
            [*DEPLOY, ("engine_imported", 3.0)], "weights_load", 3.0,
            {"placing": 0.5, "starting": 0.5, "engine_import": 2.0}, id="imported",
        ),
        pytest.param(
            [*DEPLOY, ("engine_imported", 3.0), ("weights_loaded", 7.0)], "engine_warmup", 7.0,
            {"placing": 0.5, "starting": 0.5, "engine_import": 2.0, "weights_load": 4.0},
            id="weights loaded",
        ),
        pytest.param(
            [*DEPLOY, ("weights_loaded", 7.0)], "engine_warmup", 7.0,
            {"placing": 0.5, "starting": 0.5}, id="one marker never shown",
        ),
        pytest.param(
            [*DEPLOY, ("healthy", 8.0), ("unloaded", 8.5), ("loading", 9.0)], "placing", 9.0, {},
            id="a load on demand after an earlier one",
        ),
        pytest.param(
            [*DEPLOY, ("engine_imported", 2.0), ("started", 4.0)], "engine_load", 4.0,
            {"placing": 0.5, "starting": 3.5}, id="started again: the earlier run's milestone",
        ),
    ],
)  # fmt: skip
def test_a_load_under_way_shows_its_phase_and_what_it_has_finished(
    steps: list[tuple[str, float]], phase: str, since_s: float, finished: dict[str, float]
) -> None:
    progress = loadphases.progress(timeline(*steps), NOW)
    assert progress is not None
    assert (progress.phase, progress.since, progress.phases_s) == (
        phase,
        T0 + timedelta(seconds=since_s),
        finished,
    )
    assert progress.elapsed_s == pytest.approx(10.0 - since_s)


def test_an_event_newer_than_the_read_is_never_in_the_future() -> None:
    """An event written between taking the time and reading the events: the progress is as
    of that event (elapsed 0), never of a moment before what it shows."""
    progress = loadphases.progress(timeline(*DEPLOY, ("engine_imported", 10.5)), NOW)
    assert progress is not None
    assert progress.since == progress.as_of == T0 + timedelta(seconds=10.5)
    assert progress.elapsed_s == 0.0


@pytest.mark.parametrize(
    "steps",
    [[], [("placed", 0.0)], [*DEPLOY, ("healthy", 8.0)], [*DEPLOY, ("healthy", 8.0), ("x", 9)]],
    ids=["no events", "no beginning", "served", "served, then other steps"],
)
def test_no_progress_without_a_load_under_way(steps: list[tuple[str, float]]) -> None:
    assert loadphases.progress(timeline(*steps), NOW) is None


def kinds(db: Database, deployment_id: str) -> list[str]:
    return [event.kind for event in events.since(db, deployment_id)]


def test_the_engines_milestones_land_between_its_start_and_healthy(
    db: Database, model_id: str
) -> None:
    """Each milestone once, at the poll that saw it; the healthy event has all the phases,
    the engine's parts summing to engine_load, and the histogram counts each."""
    script = Script(
        ready_after_polls=3, milestones=(Milestone.ENGINE_IMPORTED, Milestone.WEIGHTS_LOADED)
    )
    reconciler = Reconciler(db, ScriptedRuntime(script), owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    for _ in range(5):
        reconciler.run_once()

    assert kinds(db, deployment_id) == [
        "requested", "placed", "reserved", "started", "engine_imported", "weights_loaded",
        "healthy",
    ]  # fmt: skip
    healthy = events.since(db, deployment_id)[-1]
    assert healthy.data is not None
    phases = healthy.data["load_phases_s"]
    assert list(phases) == [
        "placing", "starting", "engine_import", "weights_load", "engine_warmup", "engine_load",
    ]  # fmt: skip
    parts = sum(phases[name] for name in loadphases.ENGINE_PARTS)
    assert parts == pytest.approx(phases["engine_load"], abs=0.004)
    assert "(engine_import " in healthy.message
    (family,) = [f for f in reconciler.counters.collect() if f.name == "cohabit_load_phase_seconds"]
    counted = {
        s.labels["phase"] for s in family.samples if s.name == "cohabit_load_phase_seconds_count"
    }
    assert counted == set(phases)


def test_one_first_token_per_load_from_the_first_held_answer(db: Database, model_id: str) -> None:
    """Answers the gateway marked: one before the load served does not count; of two after,
    the first is the load's `first_token`, and a later mark in the same load adds none."""
    reconciler = Reconciler(db, ScriptedRuntime(Script(ready_after_polls=1)), owner="one")
    deployment_id = admit(db, model_id, 6 * GIB)
    reconciler.activity.answered(deployment_id)  # before it serves: no first token
    reconciler.run_once()
    reconciler.run_once()
    record = deployments.get(db, deployment_id)
    assert record.deployed_at is not None and "first_token" not in kinds(db, deployment_id)
    reconciler.activity.answered(deployment_id)
    reconciler.activity.answered(deployment_id)
    reconciler.run_once()
    reconciler.activity.answered(deployment_id)
    reconciler.run_once()

    assert kinds(db, deployment_id)[-2:] == ["healthy", "first_token"]
    first = events.since(db, deployment_id)[-1]
    assert first.data is not None and first.data["seconds"] >= 0
    (family,) = [f for f in reconciler.counters.collect() if f.name == "cohabit_load_phase_seconds"]
    counts = {
        s.labels["phase"]: s.value
        for s in family.samples
        if s.name == "cohabit_load_phase_seconds_count"
    }
    assert counts["first_token"] == 1


def test_the_gateway_marks_the_earliest_answer_until_taken() -> None:
    clock = iter([1.0, 2.0, 3.0])
    activity = Activity(clock=lambda: next(clock))
    activity.answered("a")
    activity.answered("a")
    assert activity.first_answers() == {"a": 1.0}
    assert activity.first_answers() == {}
    activity.answered("a")
    assert activity.first_answers() == {"a": 3.0}
