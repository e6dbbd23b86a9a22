"""Priorities, preemption and the queue through the reconciler, on SQLite and PostgreSQL and
the 16 GiB T4 fleet: a deploy that does not fit unloads idle copies of lower priority and
deploys, a refusal says why preemption could not help, `queue: true` waits in priority then
arrival order and is placed when room appears. Engines: the in-process double
(tests/e2e/test_preemption_engines.py runs real llama.cpp processes)."""

from __future__ import annotations

from typing import Any

import pytest

from cohabit.placement.turns import next_turn
from cohabit.service.control import admission as service
from cohabit.service.control import room
from cohabit.service.control.reconciler import Reconciler
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.test_scaling import admit, deployed

S = DeploymentStatus


def holders(db: Database) -> list[str]:
    return sorted(r.deployment_id for r in ledger.reservations(db))


def test_a_higher_priority_deploy_unloads_an_idle_lower_copy_and_deploys(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    older = deployed(db, reconciler, model_id, 8 * GIB)
    newer = deployed(db, reconciler, model_id, 8 * GIB)
    reconciler.activity.begin(newer)  # used after `older`: `older` is the one to go
    reconciler.activity.finish(newer, seconds=0.01, ok=True)
    important = admit(db, model_id, 6 * GIB, priority=5)
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, important).status is S.DEPLOYED
    assert deployments.get(db, older).status is S.UNLOADED
    assert deployments.get(db, newer).status is S.DEPLOYED
    assert holders(db) == sorted([newer, important])
    assert older in runtime.stops
    placed = [e for e in events.since(db, important) if e.kind == "placed"]
    assert len(placed) == 1  # one decision, one event
    assert placed[-1].message.startswith("placed on node-a gpu 0 after unloading tiny ")
    assert "(priority 0, idle " in placed[-1].message
    assert placed[-1].data["unloaded"][0]["deployment_id"] == older
    unloaded = events.since(db, older)[-1]
    assert unloaded.kind == "unloaded"
    assert unloaded.message == "unloaded: preempted by tiny (priority 5)"


def test_busy_and_higher_priority_copies_are_never_unloaded(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    busy = deployed(db, reconciler, model_id, 8 * GIB)
    high = deployed(db, reconciler, model_id, 8 * GIB, priority=9)
    reconciler.activity.begin(busy)
    wanted = admit(db, model_id, 6 * GIB, priority=5)
    reconciler.run_once()
    record = deployments.get(db, wanted)
    assert record.status is S.FAILED and record.last_error_code == "NoFitError"
    assert record.last_error_message is not None
    assert record.last_error_message.endswith(
        "preemption cannot help: no idle copy it may unload (priority below 5, or 5 with "
        "min_copies 0) holds budget where it could go; 1 busy, 1 of higher priority"
    )
    assert record.no_fit is not None
    assert record.no_fit["preemption"]["block"] == "no_candidates"
    assert holders(db) == sorted([busy, high])
    assert runtime.stops == []


def test_a_low_priority_deploy_on_a_card_of_higher_ones_is_no_fit(
    db: Database, model_id: str
) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    for _ in range(2):
        deployed(db, reconciler, model_id, 8 * GIB, priority=5, min_copies=0)
    wanted = admit(db, model_id, 6 * GIB)
    reconciler.run_once()
    record = deployments.get(db, wanted)
    assert record.status is S.FAILED
    assert record.no_fit is not None
    assert record.no_fit["preemption"]["higher_priority_copies"] == 2


def test_equal_priority_unloads_only_copies_that_scale_to_zero(db: Database, model_id: str) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    pinned = deployed(db, reconciler, model_id, 8 * GIB, priority=1)
    elastic = deployed(db, reconciler, model_id, 8 * GIB, priority=1, min_copies=0)
    wanted = admit(db, model_id, 6 * GIB, priority=1)
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, wanted).status is S.DEPLOYED
    assert deployments.get(db, elastic).status is S.UNLOADED
    assert deployments.get(db, pinned).status is S.DEPLOYED


def test_queued_waits_with_its_position_and_is_placed_when_room_appears(
    db: Database, model_id: str
) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    first = deployed(db, reconciler, model_id, 8 * GIB, priority=5)
    second = deployed(db, reconciler, model_id, 8 * GIB, priority=5)
    late = admit(db, model_id, 8 * GIB, queue=True)
    urgent = admit(db, model_id, 8 * GIB, priority=3, queue=True)
    reconciler.run_once()
    reconciler.run_once()
    late_record, urgent_record = deployments.get(db, late), deployments.get(db, urgent)
    assert (late_record.status, urgent_record.status) == (S.QUEUED, S.QUEUED)
    # Priority first: the later but higher-priority one is ahead.
    assert urgent_record.no_fit is not None and urgent_record.no_fit["queue_position"] == 1
    assert late_record.no_fit is not None and late_record.no_fit["queue_position"] == 2
    assert late_record.last_error_message is not None
    assert late_record.last_error_message.startswith(
        "queued at position 2 of 2: insufficient_capacity: 0/1 nodes fit"
    )
    assert "preemption cannot help" in late_record.last_error_message
    assert "queued" in [e.kind for e in events.since(db, late)]
    assert holders(db) == sorted([first, second])
    # One stops: the head of the queue takes its room, the other moves up.
    assert service.stop(db, runtime, first) is True
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, urgent).status is S.DEPLOYED
    late_record = deployments.get(db, late)
    assert late_record.status is S.QUEUED
    assert late_record.no_fit is not None and late_record.no_fit["queue_position"] == 1
    assert service.stop(db, runtime, second) is True
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, late).status is S.DEPLOYED
    assert holders(db) == sorted([urgent, late])


def test_a_pass_in_which_nothing_changed_decides_no_turn(
    db: Database, model_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn plans every queued deployment before it; a pass in which nothing a turn
    depends on has changed (the queue, the fleet and its reservations, which copies may be
    unloaded) plans nothing, so a long queue costs nothing while it waits. A stop changes the
    reservations: the next pass decides again and places the head of the queue."""
    turns: list[int] = []

    def counted(line: Any, *args: Any) -> Any:
        turns.append(len(line))
        return next_turn(line, *args)

    monkeypatch.setattr(room, "next_turn", counted)
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    blocker = deployed(db, reconciler, model_id, 14 * GIB, priority=5)
    queued = [admit(db, model_id, 10 * GIB, queue=True) for _ in range(3)]
    for _ in range(4):  # queued, positions shown, then nothing more to show
        reconciler.run_once()
    assert [deployments.get(db, q).status for q in queued] == [S.QUEUED] * 3
    decided = len(turns)
    assert decided > 0
    for _ in range(3):
        reconciler.run_once()
    assert len(turns) == decided
    assert service.stop(db, runtime, blocker) is True
    reconciler.run_once()
    reconciler.run_once()
    assert len(turns) > decided
    assert deployments.get(db, queued[0]).status is S.DEPLOYED
    assert [deployments.get(db, q).status for q in queued[1:]] == [S.QUEUED] * 2


def test_a_queued_deployment_can_be_stopped(db: Database, model_id: str) -> None:
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployed(db, reconciler, model_id, 14 * GIB, priority=1)
    waiting = admit(db, model_id, 8 * GIB, queue=True)
    reconciler.run_once()
    assert deployments.get(db, waiting).status is S.QUEUED
    assert service.stop(db, runtime, waiting) is True
    assert deployments.get(db, waiting).status is S.STOPPED
    reconciler.run_once()
    assert deployments.get(db, waiting).status is S.STOPPED


def test_a_queued_deployment_preempts_copies_that_become_idle(db: Database, model_id: str) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    low = deployed(db, reconciler, model_id, 14 * GIB)
    reconciler.activity.begin(low)
    waiting = admit(db, model_id, 8 * GIB, priority=2, queue=True)
    reconciler.run_once()
    assert deployments.get(db, waiting).status is S.QUEUED
    reconciler.activity.finish(low, seconds=0.5, ok=True)
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, waiting).status is S.DEPLOYED
    assert deployments.get(db, low).status is S.UNLOADED


class RacingReconciler(Reconciler):
    """A request reaches the first copy chosen for unloading just before it is unloaded."""

    raced = False

    def unload(self, deployment_id: str, *, reason: str) -> bool:
        if not self.raced:
            self.raced = True
            self.activity.begin(deployment_id)
        return super().unload(deployment_id, reason=reason)


def test_a_race_lost_while_making_room_is_tried_again_on_the_next_pass(
    db: Database, model_id: str
) -> None:
    reconciler = RacingReconciler(db, ScriptedRuntime(), owner="one")
    older = deployed(db, reconciler, model_id, 8 * GIB)
    newer = deployed(db, reconciler, model_id, 8 * GIB)
    important = admit(db, model_id, 6 * GIB, priority=5)
    reconciler.run_once()
    assert reconciler.raced
    # `older` (least recently used) was chosen, then got a request: nothing was unloaded.
    assert deployments.get(db, important).status is S.REQUESTED
    assert deployments.get(db, older).status is S.DEPLOYED
    assert holders(db) == sorted([older, newer])
    reconciler.run_once()
    reconciler.run_once()
    assert deployments.get(db, important).status is S.DEPLOYED
    assert deployments.get(db, older).status is S.DEPLOYED  # busy now: kept
    assert deployments.get(db, newer).status is S.UNLOADED
