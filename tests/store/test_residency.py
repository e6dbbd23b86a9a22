"""Sleeping reservations in the ledger (store/residency.py, placement/residency.py): a
sleeping copy holds its residue on its devices and, at level 1, its weights in the host's
memory; a wake takes its budget back only when it fits, in the same locked transaction.

The property: over random sequences of deploy, sleep, wake, unload, load, and a deploy into
the room a sleeper left followed by the sleeper's wake, which makes room (copies beside it
put to sleep or unloaded, as `placement.residency.room_to_wake` chooses), on a small fleet:
what is held on each GPU never exceeds its capacity, the host memory sleepers keep never
exceeds the host's budget, a wake that does not fit changes nothing, and one for which room
was made fits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.preemption import Candidate
from cohabit.placement.request import PlacementRequest
from cohabit.placement.residency import (
    SleepLevel,
    WakeShortfall,
    host_budget_bytes,
    room_to_wake,
)
from cohabit.placement.state import FleetState
from cohabit.store import deployments, ledger, residency
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus
from cohabit.store.tables import ReservationRow
from cohabit.units import GIB
from tests.store.helpers import add_model, new_deployment

OWNER = "me"
S = DeploymentStatus
# One node: two 16 GiB GPUs shared by budget, 24 GiB of host memory (16 GiB after the
# OS's 8 GiB): room for one 12 GiB sleeper's weights at level 1, not two.
FLEET = Fleet(
    nodes=(
        Node(
            name="node-a",
            memory_bytes=24 * GIB,
            gpus=tuple(
                Gpu(index=i, vendor=Vendor.NVIDIA, product="L4", memory_bytes=16 * GIB)
                for i in range(2)
            ),
        ),
    )
)

ONE_GPU = Fleet(nodes=(Node(name="node-a", memory_bytes=24 * GIB, gpus=FLEET.nodes[0].gpus[:1]),))


@contextlib.contextmanager
def on_one_gpu(db: Database) -> Iterator[None]:
    """The ledger emptied and holding `ONE_GPU` for the block, `FLEET` again after it."""
    with db.write() as session:
        session.query(ReservationRow).delete()
    ledger.save_fleet(db, ONE_GPU)
    try:
        yield
    finally:
        ledger.save_fleet(db, FLEET)


@pytest.fixture(scope="module")
def db(module_database_url: str) -> Iterator[Database]:
    database = Database(module_database_url)
    database.migrate()
    ledger.save_fleet(database, FLEET)
    yield database
    database.dispose()


def start(db: Database, model: tuple[str, str], size_bytes: int) -> str:
    """A deployment this owner drives, DEPLOYING (so `ledger.reserve` may place it)."""
    new = new_deployment(model, size_bytes, engine="vllm")
    record = deployments.create(db, new)
    assert deployments.claim(db, owner=OWNER, lease_s=60)
    assert deployments.advance(db, record.id, owner=OWNER, allowed=[S.REQUESTED], to=S.DEPLOYING)
    return record.id


def place(db: Database, deployment_id: str, size_bytes: int) -> bool:
    """Reserve its budget (from DEPLOYING, or DEPLOYED after an unload) and, when it fits,
    call it DEPLOYED, as its engine would once ready."""
    deployments.advance(db, deployment_id, owner=OWNER, allowed=[S.DEPLOYED], to=S.DEPLOYING)
    request = PlacementRequest(name=deployment_id, vram_bytes=size_bytes)
    decision = ledger.reserve(db, deployment_id=deployment_id, owner=OWNER, request=request)
    if not isinstance(decision, Placement):
        return False
    assert deployments.advance(db, deployment_id, owner=OWNER, allowed=[S.DEPLOYING], to=S.DEPLOYED)
    return True


def check_invariant(state: FleetState) -> None:
    used = state.used_bytes()
    for slot in state.slots:
        assert used.get(slot.key, 0) <= slot.capacity_bytes, f"{slot.location} over-committed"
    for node in state.fleet.nodes:
        budget = host_budget_bytes(node) or 0
        parked = sum(r.host_bytes for r in state.reservations if r.node == node.name)
        assert parked <= budget, f"{node.name}: host memory over-committed"


@dataclass
class Copy:
    size_bytes: int
    priority: int = 0
    can_sleep: bool = True  # else preemption can only unload it
    held: bool = False
    level: SleepLevel | None = None
    ids: list[str] = field(default_factory=list)


def sleep(db: Database, copy: Copy, weights_bytes: int) -> None:
    """Put a held, awake copy to sleep with a 1 GiB residue, as the warm tier does."""
    level = residency.begin_sleep(db, copy.ids[0], weights_bytes=weights_bytes)
    assert level is not None
    assert residency.settle_sleep(db, copy.ids[0], residue_bytes=GIB)
    copy.level = level


def free_beside(state: FleetState, deployment: str) -> int:
    """What the device a one-device copy holds has free."""
    (device,) = {r.slot_key for r in state.reservations if r.deployment == deployment}
    slots = [slot.key for slot in state.slots]
    return state.free_bytes()[slots.index(device)]


def wake_making_room(db: Database, copy: Copy, copies: list[Copy]) -> None:
    """Wake a sleeping copy, making room as the control loop does: the other held copies are
    idle candidates (scale to zero, of their priority); the awake ones that can sleep may."""
    others = {c.ids[0]: c for c in copies if c is not copy and c.held}
    candidates = [
        Candidate(deployment=i, name=i, priority=c.priority, scale_to_zero=True, idle_s=n)
        for n, (i, c) in enumerate(others.items())
    ]
    before = ledger.current_state(db)
    room = room_to_wake(
        before,
        copy.ids[0],
        priority=copy.priority,
        candidates=candidates,
        residue_bytes={i: GIB for i, c in others.items() if c.can_sleep and c.level is None},
    )
    event("a wake with no room to make" if room is None else "a wake that made room")
    if room is None:
        assert residency.take_back(db, copy.ids[0]) is not None
        assert ledger.current_state(db).reservations == before.reservations
        return
    assert not (room.sleepers and room.victims)
    if room.sleepers or room.victims:
        event("put copies to sleep" if room.sleepers else "unloaded copies")
    for sleeper in room.sleepers:
        assert others[sleeper.deployment].level is None
        sleep(db, others[sleeper.deployment], weights_bytes=GIB)
        check_invariant(ledger.current_state(db))
    for victim in room.victims:
        assert others[victim.deployment].priority <= copy.priority
        with db.write() as session:
            ledger.release(session, victim.deployment)
        others[victim.deployment].held, others[victim.deployment].level = False, None
        check_invariant(ledger.current_state(db))
    assert residency.take_back(db, copy.ids[0]) is None  # the room made is enough
    residency.awake(db, copy.ids[0])
    copy.level = None
    held = [r for r in ledger.current_state(db).reservations if r.deployment == copy.ids[0]]
    assert [r.reserved_bytes for r in held] == [copy.size_bytes]


Step = tuple[str, int, int]
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["deploy", "sleep", "wake", "crowd-then-wake", "unload", "load"]),
        st.integers(min_value=0, max_value=5),  # which copy
        st.integers(min_value=1, max_value=14),  # GiB: a deploy's budget, a sleep's weights
    ),
    max_size=24,
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=STEPS)
def test_what_gpus_and_hosts_hold_never_exceeds_them(db: Database, steps: list[Step]) -> None:
    with db.write() as session:  # each example starts on an empty ledger
        session.query(ReservationRow).delete()
    model = add_model(db)
    copies: list[Copy] = []
    for action, which, gib in steps:
        copy = copies[which % len(copies)] if copies else None
        if action == "deploy" or copy is None:
            copy = Copy(size_bytes=gib * GIB, priority=gib % 2, can_sleep=gib % 3 != 0)
            copy.ids.append(start(db, model, copy.size_bytes))
            copy.held = place(db, copy.ids[0], copy.size_bytes)
            copies.append(copy)
        elif action == "sleep" and copy.held and copy.level is None:
            sleep(db, copy, weights_bytes=min(gib * GIB, copy.size_bytes))
        elif action == "crowd-then-wake" and any(c.level is not None for c in copies):
            # A copy deployed into the room a sleeper left, then the sleeper's wake.
            asleep = [c for c in copies if c.level is not None]
            sleeper = asleep[which % len(asleep)]
            room = free_beside(ledger.current_state(db), sleeper.ids[0]) // GIB * GIB
            if room:
                crowd = Copy(size_bytes=room, priority=gib % 2, can_sleep=gib % 3 != 0)
                crowd.ids.append(start(db, model, crowd.size_bytes))
                crowd.held = place(db, crowd.ids[0], crowd.size_bytes)
                copies.append(crowd)
            wake_making_room(db, sleeper, copies)
        elif action == "wake" and copy.level is not None:
            before = ledger.current_state(db)
            shortfall = residency.take_back(db, copy.ids[0])
            after = ledger.current_state(db)
            if shortfall is None:
                residency.awake(db, copy.ids[0])  # the engine woke
                copy.level = None
                after = ledger.current_state(db)
                held = [r for r in after.reservations if r.deployment == copy.ids[0]]
                assert [r.reserved_bytes for r in held] == [copy.size_bytes]
                assert not held[0].asleep and held[0].host_bytes == 0
            else:
                assert isinstance(shortfall, WakeShortfall)
                assert after.reservations == before.reservations  # nothing written
                reason = shortfall.reasons[0]
                assert reason.free_bytes < reason.requested_bytes == copy.size_bytes
        elif action == "unload" and copy.held:
            with db.write() as session:
                ledger.release(session, copy.ids[0])
            copy.held, copy.level = False, None
        elif action == "load" and not copy.held:
            copy.held = place(db, copy.ids[0], copy.size_bytes)
        check_invariant(ledger.current_state(db))


def test_a_sleeper_frees_its_budget_for_another_and_cannot_wake_until_room_returns(
    db: Database,
) -> None:
    """Two 12 GiB copies on one 16 GiB GPU: the second fits only while the first sleeps,
    and the first wakes only after the second is unloaded."""
    with on_one_gpu(db):
        model = add_model(db)
        first = start(db, model, 12 * GIB)
        assert place(db, first, 12 * GIB)
        second = start(db, model, 12 * GIB)
        assert not place(db, second, 12 * GIB)
        assert residency.begin_sleep(db, first, weights_bytes=8 * GIB) is SleepLevel.OFFLOAD
        assert residency.settle_sleep(db, first, residue_bytes=GIB)
        assert residency.sleep_levels(db)[first] is SleepLevel.OFFLOAD
        assert place(db, second, 12 * GIB)
        shortfall = residency.take_back(db, first)
        assert shortfall is not None
        assert shortfall.message == (
            "cannot wake: node-a gpu 0 has 4 GiB free of 16 GiB, 12 GiB needed"
        )
        with db.write() as session:
            ledger.release(session, second)
        assert residency.take_back(db, first) is None
        assert first not in residency.sleep_levels(db)
        residency.awake(db, first)
        check_invariant(ledger.current_state(db))


def test_level_two_when_the_host_cannot_take_the_weights(db: Database) -> None:
    """16 GiB of host budget: one sleeper's 12 GiB of weights fit, a second's do not."""
    with db.write() as session:
        session.query(ReservationRow).delete()
    model = add_model(db)
    first, second = (start(db, model, 14 * GIB) for _ in range(2))
    assert place(db, first, 14 * GIB) and place(db, second, 14 * GIB)
    assert residency.begin_sleep(db, first, weights_bytes=12 * GIB) is SleepLevel.OFFLOAD
    assert residency.begin_sleep(db, second, weights_bytes=12 * GIB) is SleepLevel.DISCARD
    residency.awake(db, first)  # the engine did not sleep: the host memory is let go
    state = ledger.current_state(db)
    assert sum(r.host_bytes for r in state.reservations) == 0
    assert not any(r.asleep for r in state.reservations)


@pytest.mark.parametrize(
    ("measured_gib", "crowd_gib", "held_gib", "over_budget", "short_of_room"),
    [
        (0.5, 0, 0.5, False, False),  # below the estimate: held as measured
        (3, 0, 3, False, False),  # above the estimate, within the budget and the room
        (14, 0, 12, True, False),  # above its whole budget: the budget
        (6, 12, 4, False, True),  # 3 GiB free beside a 12 GiB copy: 1 + 3 held
    ],
    ids=["lower", "higher", "over-budget", "short-of-room"],
)
def test_a_measured_residue_replaces_the_estimate_within_the_budget_and_the_room(
    db: Database,
    measured_gib: float,
    crowd_gib: int,
    held_gib: float,
    over_budget: bool,
    short_of_room: bool,
) -> None:
    """A 12 GiB copy asleep on a 16 GiB GPU with a 1 GiB estimated residue, measured."""
    with on_one_gpu(db):
        model = add_model(db)
        sleeper = start(db, model, 12 * GIB)
        assert place(db, sleeper, 12 * GIB)
        assert residency.begin_sleep(db, sleeper, weights_bytes=0) is SleepLevel.DISCARD
        assert residency.settle_sleep(db, sleeper, residue_bytes=GIB)
        if crowd_gib:
            assert place(db, start(db, model, crowd_gib * GIB), crowd_gib * GIB)
        found = residency.measure_residue(db, sleeper, measured_bytes=int(measured_gib * GIB))
        assert found is not None
        assert (found.residue_bytes, found.budget_bytes) == (int(held_gib * GIB), 12 * GIB)
        assert (found.over_budget, found.short_of_room) == (over_budget, short_of_room)
        state = ledger.current_state(db)
        (held,) = [r for r in state.reservations if r.deployment == sleeper]
        assert (held.reserved_bytes, held.budget_bytes) == (int(held_gib * GIB), 12 * GIB)
        check_invariant(state)
        shortfall = residency.take_back(db, sleeper)  # a wake takes the whole budget back
        assert (shortfall is None) is (crowd_gib == 0)
        held_now = [r for r in ledger.current_state(db).reservations if r.deployment == sleeper]
        assert [r.reserved_bytes for r in held_now] == [
            12 * GIB if shortfall is None else int(held_gib * GIB)
        ]


def test_only_a_copy_asleep_on_one_device_takes_a_measured_residue(db: Database) -> None:
    """Awake, nothing to measure; the meter's figure is one sum for an engine on several
    devices, so a copy asleep on two keeps the estimate; and a reading of nothing is a
    driver that does not see the engine's process: the estimate stays."""
    with db.write() as session:
        session.query(ReservationRow).delete()
    model = add_model(db)
    awake = start(db, model, 4 * GIB)
    assert place(db, awake, 4 * GIB)
    assert residency.measure_residue(db, awake, measured_bytes=GIB) is None
    two = start(db, model, 8 * GIB)
    deployments.advance(db, two, owner=OWNER, allowed=[S.DEPLOYED], to=S.DEPLOYING)
    request = PlacementRequest(name=two, vram_bytes=8 * GIB, tensor_parallel=2)
    assert isinstance(
        ledger.reserve(db, deployment_id=two, owner=OWNER, request=request), Placement
    )
    assert deployments.advance(db, two, owner=OWNER, allowed=[S.DEPLOYING], to=S.DEPLOYED)
    assert residency.begin_sleep(db, two, weights_bytes=0) is SleepLevel.DISCARD
    assert residency.settle_sleep(db, two, residue_bytes=GIB)
    assert residency.measure_residue(db, two, measured_bytes=GIB // 2) is None
    held = [r.reserved_bytes for r in ledger.current_state(db).reservations if r.deployment == two]
    assert held == [GIB, GIB]
    one = start(db, model, 4 * GIB)
    assert place(db, one, 4 * GIB)
    assert residency.begin_sleep(db, one, weights_bytes=0) is SleepLevel.DISCARD
    assert residency.settle_sleep(db, one, residue_bytes=GIB)
    assert residency.measure_residue(db, one, measured_bytes=0) is None
    held = [r.reserved_bytes for r in ledger.current_state(db).reservations if r.deployment == one]
    assert held == [GIB]
