"""Sleeping reservations in the ledger (store/residency.py, placement/residency.py): a
sleeping copy holds its residue on its devices and, at level 1, its weights in the host's
memory; a wake takes its budget back only when it fits, in the same locked transaction.

The property: over random sequences of deploy, sleep, wake, unload and load on a small fleet,
what is held on each GPU never exceeds its capacity, the host memory sleepers keep never
exceeds the host's budget, and a wake that does not fit changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.request import PlacementRequest
from cohabit.placement.residency import SleepLevel, WakeShortfall, host_budget_bytes
from cohabit.placement.state import FleetState
from cohabit.store import deployments, ledger, residency
from cohabit.store.database import Database
from cohabit.store.records import DeploymentStatus, NewDeployment, Scaling
from cohabit.store.tables import ReservationRow
from cohabit.units import GIB
from tests.store.helpers import add_model

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


@pytest.fixture(scope="module")
def db(module_database_url: str) -> Iterator[Database]:
    database = Database(module_database_url)
    database.migrate()
    ledger.save_fleet(database, FLEET)
    yield database
    database.dispose()


def start(db: Database, model: tuple[str, str], size_bytes: int) -> str:
    """A deployment this owner drives, DEPLOYING (so `ledger.reserve` may place it)."""
    new = NewDeployment(
        id=str(uuid.uuid4()),
        model_id=model[0],
        config_id=model[1],
        file_id=None,
        model_name="tiny",
        engine="vllm",
        request={},
        model_path="/models/tiny",
        requested_bytes=size_bytes,
        tensor_parallel=1,
        max_model_len=None,
        estimate=None,
        scaling=Scaling(),
    )
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
    held: bool = False
    level: SleepLevel | None = None
    ids: list[str] = field(default_factory=list)


Step = tuple[str, int, int]
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["deploy", "sleep", "wake", "unload", "load"]),
        st.integers(min_value=0, max_value=5),  # which copy
        st.integers(min_value=1, max_value=14),  # GiB: a deploy's budget, a sleep's weights
    ),
    max_size=24,
)


@settings(
    max_examples=40,
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
            copy = Copy(size_bytes=gib * GIB)
            copy.ids.append(start(db, model, copy.size_bytes))
            copy.held = place(db, copy.ids[0], copy.size_bytes)
            copies.append(copy)
        elif action == "sleep" and copy.held and copy.level is None:
            weights = min(gib * GIB, copy.size_bytes)
            level = residency.begin_sleep(db, copy.ids[0], weights_bytes=weights)
            assert level is not None
            assert residency.settle_sleep(db, copy.ids[0], residue_bytes=GIB)
            copy.level = level
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
    with db.write() as session:
        session.query(ReservationRow).delete()
    ledger.save_fleet(db, ONE_GPU)
    try:
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
    finally:
        ledger.save_fleet(db, FLEET)


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
