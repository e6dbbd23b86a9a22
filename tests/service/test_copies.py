"""A deployment's copies, one reconciler pass at a time on SQLite and PostgreSQL: placed in one
decision (spread across devices and nodes, sharing a device only when nothing else fits, all
reserved or none), stopped and unloaded together, a copy failing alone while another serves,
and two reconcilers that never place a copy twice. Engines: the in-process double (the e2e
test runs real llama.cpp copies)."""

from __future__ import annotations

import threading

import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.service.control import admission as service
from cohabit.service.control.autoscale import Autoscaler
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.errors import NeverFits
from cohabit.store import deployments, events, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord, DeploymentStatus
from cohabit.units import GIB
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.test_reconciler import admit

S = DeploymentStatus


def card(index: int) -> Gpu:
    return Gpu(index=index, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB)


TWO_CARDS = Fleet(nodes=(Node(name="node-a", gpus=(card(0), card(1))),))
TWO_NODES = Fleet(
    nodes=(Node(name="node-a", gpus=(card(0),)), Node(name="node-b", gpus=(card(0),)))
)


@pytest.fixture
def two_cards(db: Database) -> Database:
    ledger.save_fleet(db, TWO_CARDS)
    return db


def rows(db: Database, deployment_id: str) -> list[DeploymentRecord]:
    return deployments.copies_of(db, deployment_id)


def where(record: DeploymentRecord) -> tuple[str, int | None] | None:
    placement = record.placement
    return None if placement is None else (placement.node_name, placement.gpu_index)


def serving(
    db: Database, model_id: str, **scaling: object
) -> tuple[ScriptedRuntime, Reconciler, str]:
    """A deployment of copies of 6 GiB each, placed and DEPLOYED by one reconciler."""
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB, **scaling)
    reconciler.run_once()
    reconciler.run_once()
    assert {r.status for r in rows(db, deployment_id)} == {S.DEPLOYED}
    return runtime, reconciler, deployment_id


def messages(db: Database, deployment_id: str, kind: str) -> list[str]:
    return [e.message for e in events.since(db, deployment_id) if e.kind == kind]


def test_two_copies_spread_over_two_cards_in_one_decision(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    deployment_id = admit(db, model_id, 6 * GIB, starting_copies=2)
    reconciler.run_once()
    first, second = rows(db, deployment_id)
    assert {where(first), where(second)} == {("node-a", 0), ("node-a", 1)}
    assert sorted(r.deployment_id for r in ledger.reservations(db)) == sorted([first.id, second.id])
    assert sorted(launch.deployment_id for launch in runtime.starts) == sorted(
        [first.id, second.id]
    )
    (placed,) = messages(db, deployment_id, "placed")
    assert "copy 0 on node-a gpu" in placed and "copy 1 on node-a gpu" in placed
    assert "a device no other copy holds" in placed
    reconciler.run_once()
    assert [r.status for r in rows(db, deployment_id)] == [S.DEPLOYED, S.DEPLOYED]


def test_copies_prefer_another_node(db: Database, model_id: str) -> None:
    ledger.save_fleet(db, TWO_NODES)
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")
    deployment_id = admit(db, model_id, 6 * GIB, starting_copies=2)
    reconciler.run_once()
    assert [where(r) for r in rows(db, deployment_id)] == [("node-a", 0), ("node-b", 0)]
    (placed,) = messages(db, deployment_id, "placed")
    assert "copy 1 on node-b gpu 0, a node no other copy holds" in placed


def test_copies_share_a_card_only_when_no_other_has_room(db: Database, model_id: str) -> None:
    reconciler = Reconciler(db, ScriptedRuntime(), owner="one")  # the one-card T4 fleet
    deployment_id = admit(db, model_id, 4 * GIB, starting_copies=2)
    reconciler.run_once()
    assert [where(r) for r in rows(db, deployment_id)] == [("node-a", 0), ("node-a", 0)]
    (placed,) = messages(db, deployment_id, "placed")
    assert "copy 1 on node-a gpu 0, beside another copy: no device without one had room" in placed


def test_copies_that_could_never_all_fit_are_refused_at_admission(
    db: Database, model_id: str
) -> None:
    """Two 10 GiB copies on one 16 GiB card: a 409 saying how many would fit, nothing stored."""
    with pytest.raises(NeverFits, match="only 1 of 2 copies fit: 0/1 nodes fit") as refused:
        admit(db, model_id, 10 * GIB, starting_copies=2)
    assert (refused.value.body["copies_wanted"], refused.value.body["copies_fit"]) == (2, 1)
    assert deployments.list_all(db, copies=True) == []


def test_all_or_nothing_two_copies_with_room_for_one_reserve_nothing(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    blocker = admit(db, model_id, 12 * GIB)
    reconciler.run_once()
    deployment_id = admit(db, model_id, 10 * GIB, starting_copies=2)
    reconciler.run_once()
    assert {r.deployment_id for r in ledger.reservations(db)} == {blocker}  # nothing more
    assert [launch.deployment_id for launch in runtime.starts] == [blocker]
    records = rows(db, deployment_id)
    assert [r.status for r in records] == [S.FAILED, S.FAILED]
    record = records[0]
    assert record.last_error_message is not None
    assert "only 1 of 2 copies fit" in record.last_error_message
    assert record.no_fit is not None
    assert (record.no_fit["copies_wanted"], record.no_fit["copies_fit"]) == (2, 1)
    (no_fit,) = messages(db, deployment_id, "no_fit")
    assert "only 1 of 2 copies fit" in no_fit
    assert deployments.claim(db, owner="two", lease_s=30) == []  # nothing left to drive


def test_queued_copies_wait_together_and_are_placed_when_room_appears(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime = ScriptedRuntime()
    reconciler = Reconciler(db, runtime, owner="one")
    blocker = admit(db, model_id, 12 * GIB)
    reconciler.run_once()
    deployment_id = admit(db, model_id, 10 * GIB, starting_copies=2, queue=True)
    reconciler.run_once()
    assert [r.status for r in rows(db, deployment_id)] == [S.QUEUED, S.REQUESTED]
    assert {r.deployment_id for r in ledger.reservations(db)} == {blocker}
    reconciler.run_once()  # still no room: its copy stays unclaimed, nothing placed
    assert [r.status for r in rows(db, deployment_id)] == [S.QUEUED, S.REQUESTED]
    (queued,) = messages(db, deployment_id, "queued")  # waiting, not taken and put back
    assert "only 1 of 2 copies fit" in queued
    service.stop(db, runtime, blocker)
    reconciler.run_once()
    records = rows(db, deployment_id)
    assert all(r.status in {S.INITIALIZING, S.DEPLOYED} for r in records)
    assert {where(r) for r in records} == {("node-a", 0), ("node-a", 1)}


def test_stop_ends_every_copy_releases_every_budget_and_stops_every_engine(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id = serving(db, model_id, starting_copies=3)
    ids = [r.id for r in rows(db, deployment_id)]
    assert len(ledger.reservations(db)) == 3
    assert service.stop(db, runtime, deployment_id, by="test") is True
    assert ledger.reservations(db) == []
    assert [r.status for r in rows(db, deployment_id)] == [S.STOPPED] * 3
    assert sorted(runtime.stops) == sorted(ids)
    assert service.stop(db, runtime, deployment_id) is False
    reconciler.run_once()
    assert len(runtime.starts) == 3  # nothing started again


def test_unloading_unloads_every_copy_and_a_load_starts_copy_zero(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id = serving(db, model_id, starting_copies=2, min_copies=0)
    first, second = rows(db, deployment_id)
    assert reconciler.unload(deployment_id, reason="idle for 300 s") is True
    assert [r.status for r in rows(db, deployment_id)] == [S.UNLOADED, S.STOPPED]
    assert ledger.reservations(db) == []
    assert sorted(runtime.stops) == sorted([first.id, second.id])
    assert reconciler.load(deployment_id) is True
    reconciler.run_once()
    reconciler.run_once()
    assert [r.status for r in rows(db, deployment_id)] == [S.DEPLOYED, S.STOPPED]
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]


@pytest.mark.parametrize("which", [0, 1], ids=["copy-0-fails", "copy-1-fails"])
def test_a_copy_that_fails_while_another_serves_starts_again(
    two_cards: Database, model_id: str, which: int
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id = serving(db, model_id, starting_copies=2)
    before = rows(db, deployment_id)
    failing = before[which]
    runtime.fail(failing.id, RuntimeErrorCode.CONTAINER_EXITED, "killed")
    reconciler.run_once()
    after = rows(db, deployment_id)
    assert after[0].status is S.DEPLOYED  # the deployment serves on
    assert after[which].engine_handle is None or which == 1
    assert after[which].last_error_code == "CONTAINER_EXITED"
    held = {r.deployment_id for r in ledger.reservations(db)}
    assert held == {r.id for r in before}  # its budget stays held
    (restarted,) = messages(db, deployment_id, "restarted")
    assert f"copy {which} failed (CONTAINER_EXITED: killed)" in restarted
    assert [launch.deployment_id for launch in runtime.starts].count(failing.id) == 2
    reconciler.run_once()
    final = rows(db, deployment_id)
    assert [r.status for r in final] == [S.DEPLOYED, S.DEPLOYED]
    assert all(r.engine_handle is not None for r in final)


def test_a_copy_0_starting_again_is_finished_by_the_reconciler_that_takes_it_over(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, first, deployment_id = serving(db, model_id, starting_copies=2)
    runtime.fail(deployment_id, RuntimeErrorCode.CONTAINER_EXITED, "killed")
    first.run_once()  # starting again, no handle recorded yet
    assert deployments.get(db, deployment_id).engine_handle is None
    deployments.let_go(db, owner="one")  # its driver goes away
    second = Reconciler(db, runtime, owner="two")
    second.run_once()
    second.run_once()
    record = deployments.get(db, deployment_id)
    assert (record.status, record.claimed_by) == (S.DEPLOYED, "two")
    assert record.engine_handle is not None  # routed to again
    assert [launch.deployment_id for launch in runtime.starts].count(deployment_id) == 3


def test_a_copy_that_keeps_failing_at_start_ends_alone_after_three_restarts(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id = serving(db, model_id, starting_copies=2)
    second = rows(db, deployment_id)[1]
    # From now on every engine started fails at once (a broken device, say).
    runtime.scripts["tiny"] = Script(fail_code=RuntimeErrorCode.CUDA_ERROR, fail_message="bad")
    runtime.fail(second.id, RuntimeErrorCode.CONTAINER_EXITED, "killed")
    for _ in range(6):
        reconciler.run_once()
    first, second = rows(db, deployment_id)
    assert (first.status, second.status) == (S.DEPLOYED, S.ERROR)
    assert len(messages(db, deployment_id, "restarted")) == 3
    assert [launch.deployment_id for launch in runtime.starts].count(second.id) == 4
    assert scaled(db, deployment_id) == ["copy 1 ended (CUDA_ERROR): bad"]
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]


def test_when_no_copy_serves_the_failure_ends_the_deployment(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id = serving(db, model_id, starting_copies=2)
    for record in rows(db, deployment_id):
        runtime.fail(record.id, RuntimeErrorCode.CONTAINER_EXITED, "killed")
    reconciler.run_once()
    assert [r.status for r in rows(db, deployment_id)] == [S.ERROR, S.ERROR]
    assert ledger.reservations(db) == []


def test_two_reconcilers_never_place_a_copy_twice(two_cards: Database, model_id: str) -> None:
    """Both reconcilers pass at once, over and over, while deployments of copies arrive and
    one is stopped: each copy is reserved once and started once, no card holds more than it
    has, and the stopped deployment holds nothing and runs no engine."""
    db = two_cards
    runtimes = [ScriptedRuntime(), ScriptedRuntime()]
    reconcilers = [Reconciler(db, r, owner=f"r{i}") for i, r in enumerate(runtimes)]
    ids = [admit(db, model_id, 3 * GIB, starting_copies=2) for _ in range(2)]
    barrier = threading.Barrier(3)

    def passes(reconciler: Reconciler) -> None:
        for _ in range(5):
            barrier.wait()
            reconciler.run_once()

    def meanwhile() -> None:
        for step in range(5):
            barrier.wait()
            if step < 2:  # more arrive while the reconcilers pass
                ids.append(admit(db, model_id, 3 * GIB, starting_copies=2))
            elif step == 2:  # and the first is stopped while they pass
                assert service.stop(db, runtimes[0], ids[0]) is True

    threads = [threading.Thread(target=passes, args=(r,)) for r in reconcilers]
    threads.append(threading.Thread(target=meanwhile))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for reconciler in reconcilers:  # settle: each sees what the other and the stop did
        reconciler.run_once()
    stopped, *live = ids
    copy_ids = [r.id for deployment_id in live for r in rows(db, deployment_id)]
    held = [r.deployment_id for r in ledger.reservations(db)]
    assert sorted(held) == sorted(copy_ids)  # every live copy once, the stopped one not
    started = [launch.deployment_id for runtime in runtimes for launch in runtime.starts]
    assert sorted(i for i in started if i in copy_ids) == sorted(copy_ids)
    state = ledger.current_state(db)
    assert all(used <= 16 * GIB for used in state.used_bytes().values())
    assert all(r.status is S.DEPLOYED for i in live for r in rows(db, i))
    assert {r.status for r in rows(db, stopped)} == {S.STOPPED}
    gone = {r.id for r in rows(db, stopped)}
    running = {handle.deployment_id for runtime in runtimes for handle in runtime.engines()}
    assert not running & gone


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def autoscaled(
    db: Database, model_id: str, **scaling: object
) -> tuple[ScriptedRuntime, Reconciler, str, Clock]:
    """`serving`, with the autoscaler on a clock the test moves (4 per copy, 30 s windows,
    a 60 s cool-down: the defaults)."""
    runtime, reconciler, deployment_id = serving(db, model_id, **scaling)
    clock = Clock()
    reconciler.autoscaler = Autoscaler(reconciler, clock=clock)
    return runtime, reconciler, deployment_id, clock


def scaled(db: Database, deployment_id: str) -> list[str]:
    return messages(db, deployment_id, "scaled")


def test_load_above_four_per_copy_for_30_s_adds_a_copy_and_low_load_removes_it(
    two_cards: Database, model_id: str
) -> None:
    db = two_cards
    runtime, reconciler, deployment_id, clock = autoscaled(
        db, model_id, min_copies=1, starting_copies=1, max_copies=2
    )
    for _ in range(9):
        reconciler.activity.begin(deployment_id)
    reconciler.run_once()
    clock.now += 29
    reconciler.run_once()
    assert len(rows(db, deployment_id)) == 1  # not for long enough yet
    clock.now += 1
    reconciler.run_once()  # decides: one more copy
    assert scaled(db, deployment_id) == [
        "1 → 2 copies: 9 requests in flight on 1 copy, above 4 per copy for 30 s"
    ]
    reconciler.run_once()  # places it (on the other card) and starts it
    reconciler.run_once()
    first, second = rows(db, deployment_id)
    assert (second.copy_index, second.status) == (1, S.DEPLOYED)
    assert {where(first), where(second)} == {("node-a", 0), ("node-a", 1)}
    clock.now += 120
    reconciler.run_once()  # 9 on 2 copies is above 4 each, but max_copies is 2
    assert len(rows(db, deployment_id)) == 2

    for _ in range(8):
        reconciler.activity.finish(deployment_id, seconds=0.1, ok=True)
    reconciler.run_once()
    clock.now += 30
    reconciler.run_once()
    assert scaled(db, deployment_id)[-1] == (
        "2 → 1 copies: 1 request in flight on 2 copies, at most 2 per copy on 1 for 30 s"
    )
    assert [r.status for r in rows(db, deployment_id)] == [S.DEPLOYED, S.STOPPED]
    assert runtime.stops == [second.id]
    assert [r.deployment_id for r in ledger.reservations(db)] == [deployment_id]


def test_a_cool_down_follows_each_decision_and_no_room_is_an_event_not_a_failure(
    db: Database, model_id: str
) -> None:
    """One 16 GiB card holds two 6 GiB copies; the third does not fit."""
    _, reconciler, deployment_id, clock = autoscaled(
        db, model_id, min_copies=1, starting_copies=2, max_copies=3
    )
    for _ in range(20):
        reconciler.activity.begin(deployment_id)
    reconciler.run_once()
    clock.now += 30
    reconciler.run_once()
    assert len(scaled(db, deployment_id)) == 1
    reconciler.run_once()  # the third copy is tried and does not fit
    records = rows(db, deployment_id)
    assert [r.status for r in records] == [S.DEPLOYED, S.DEPLOYED, S.STOPPED]
    assert records[2].last_error_code == "NoFitError"
    said = scaled(db, deployment_id)[-1]
    assert said.startswith("copy 2 ended (NoFitError): insufficient_capacity")
    clock.now += 59
    reconciler.run_once()  # still cooling down: nothing more
    assert len(scaled(db, deployment_id)) == 2
    clock.now += 1
    reconciler.run_once()
    clock.now += 30
    reconciler.run_once()  # tried again after the cool-down and the window
    assert scaled(db, deployment_id)[-1].startswith("2 → 3 copies: 20 requests in flight")
