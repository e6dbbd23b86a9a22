"""placement/residency.py as tables: which level a sleep takes, whether a wake fits, with
the structured reasons when it does not, and the room made for one that does not (no
database: the ledger's side is tests/store/test_residency.py)."""

from __future__ import annotations

import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.preemption import Candidate
from cohabit.placement.reasons import FilterCode
from cohabit.placement.request import PlacementRequest
from cohabit.placement.residency import (
    SleepLevel,
    room_by_sleeping,
    room_to_wake,
    sleep_level,
    wake_shortfall,
)
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import GIB


def node(*, memory_gib: int | None, gpus: int = 1) -> Node:
    return Node(
        name="node-a",
        memory_bytes=None if memory_gib is None else memory_gib * GIB,
        gpus=tuple(
            Gpu(index=i, vendor=Vendor.NVIDIA, product="L4", memory_bytes=24 * GIB)
            for i in range(gpus)
        ),
    )


def held(
    deployment: str, gib: float, *, budget_gib: float | None = None, host_gib: float = 0
) -> Reservation:
    return Reservation(
        deployment=deployment,
        node="node-a",
        gpu_index=0,
        partition_index=None,
        reserved_bytes=int(gib * GIB),
        budget_bytes=None if budget_gib is None else int(budget_gib * GIB),
        host_bytes=int(host_gib * GIB),
    )


@pytest.mark.parametrize(
    ("memory_gib", "parked_gib", "weights_gib", "level"),
    [
        (64, 0, 15, SleepLevel.OFFLOAD),  # 56 GiB budget after the OS's 8
        (64, 40, 15, SleepLevel.OFFLOAD),  # 55 of 56
        (64, 42, 15, SleepLevel.DISCARD),  # 57 of 56
        (None, 0, 15, SleepLevel.DISCARD),  # host memory unknown: nothing parked there
        (64, 0, 0, SleepLevel.DISCARD),  # weights unknown
    ],
    ids=["room", "just-fits", "full", "unknown-host", "unknown-weights"],
)
def test_level_one_only_when_the_host_can_take_the_weights(
    memory_gib: int | None, parked_gib: float, weights_gib: float, level: SleepLevel
) -> None:
    reservations = (held("other", 1, budget_gib=10, host_gib=parked_gib),) if parked_gib else ()
    state = FleetState(fleet=Fleet(nodes=(node(memory_gib=memory_gib),)), reservations=reservations)
    assert sleep_level(state, node="node-a", weights_bytes=int(weights_gib * GIB)) is level


@pytest.mark.parametrize(
    ("others_gib", "fits"),
    [(0, True), (6, True), (6.5, False)],
    ids=["alone", "exactly-room", "short"],
)
def test_a_wake_fits_when_the_others_leave_its_budget(others_gib: float, fits: bool) -> None:
    """A sleeper holding 1 GiB of an 18 GiB budget on a 24 GiB card."""
    reservations = [held("sleeper", 1, budget_gib=18)]
    if others_gib:
        reservations.append(held("other", others_gib))
    state = FleetState(fleet=Fleet(nodes=(node(memory_gib=64),)), reservations=tuple(reservations))
    shortfall = wake_shortfall(state, "sleeper")
    assert (shortfall is None) is fits
    if shortfall is not None:
        (reason,) = shortfall.reasons
        assert reason.code is FilterCode.INSUFFICIENT_GPU_MEMORY
        assert (reason.requested_bytes, reason.free_bytes, reason.capacity_bytes) == (
            18 * GIB,
            int(17.5 * GIB),
            24 * GIB,
        )
        assert shortfall.message == (
            "cannot wake: node-a gpu 0 has 17.5 GiB free of 24 GiB, 18 GiB needed"
        )


def test_an_awake_deployment_has_nothing_to_take_back() -> None:
    state = FleetState(
        fleet=Fleet(nodes=(node(memory_gib=64),)), reservations=(held("awake", 23), held("x", 1))
    )
    assert wake_shortfall(state, "awake") is None


IDLE = {
    "a": Candidate(deployment="a", name="a", scale_to_zero=True, idle_s=60),
    "b": Candidate(deployment="b", name="b", scale_to_zero=True, idle_s=600),
    "busy": Candidate(deployment="busy", name="busy", scale_to_zero=True, in_flight=1),
    "high": Candidate(deployment="high", name="high", priority=5, idle_s=900),
}


@pytest.mark.parametrize(
    ("holders", "sleepable", "request_gib", "sleepers"),
    [
        ({"a": 10}, {"a"}, 12, ("a",)),  # 14 free beside a's 1 GiB residue
        ({"a": 10, "b": 10}, {"a", "b"}, 8, ("b",)),  # the longest idle goes first
        ({"a": 10, "b": 10}, {"a", "b"}, 20, ("b", "a")),  # 22 free once both sleep
        ({"a": 10, "b": 10}, {"a"}, 14, None),  # b cannot sleep: preemption's turn
        ({"busy": 10}, {"busy"}, 18, None),  # a request in flight
        ({"high": 10}, {"high"}, 18, None),  # a higher priority is never put away
        ({"a": 10}, {"a"}, 24, None),  # its residue stays: 23 GiB at most
    ],
    ids=["one", "longest-idle-first", "both", "not-sleepable", "busy", "higher", "residue"],
)
def test_room_by_sleeping_idle_copies_before_unloading_any(
    holders: dict[str, int], sleepable: set[str], request_gib: int, sleepers: tuple[str] | None
) -> None:
    """A 24 GiB card; each sleeper keeps a 1 GiB residue."""
    state = FleetState(
        fleet=Fleet(nodes=(node(memory_gib=64),)),
        reservations=tuple(held(name, gib) for name, gib in holders.items()),
    )
    found = room_by_sleeping(
        state,
        PlacementRequest(name="new", vram_bytes=request_gib * GIB),
        priority=0,
        candidates=[IDLE[name] for name in holders],
        residue_bytes={name: GIB for name in sleepable},
    )
    if sleepers is None:
        assert found is None
    else:
        assert found is not None and isinstance(found.placement, Placement)
        assert tuple(c.deployment for c in found.sleepers) == sleepers


@pytest.mark.parametrize(
    ("holders", "sleepable", "sleepers", "victims"),
    [
        ({}, set(), (), ()),  # fits as things are
        ({"a": 10}, {"a"}, ("a",), ()),  # 1 + 1 + 18 of 24 once a sleeps
        ({"a": 6, "b": 6}, {"a", "b"}, ("b", "a"), ()),  # both must sleep: longest idle first
        ({"a": 10}, set(), (), ("a",)),  # a cannot sleep: unloaded
        ({"a": 4, "b": 10}, {"a"}, (), ("b",)),  # a asleep would free 3 of the 8 needed
        ({"a": 4, "b": 4}, set(), (), ("b",)),  # one is enough: the longest idle
        ({"busy": 10}, {"busy"}, None, None),  # a request in flight: nothing to do
        ({"high": 10}, {"high"}, None, None),  # a higher priority stays as it is
        ({"a": 4, "high": 7}, {"a"}, None, None),  # 7 GiB stay: 1 more than it leaves
    ],
    ids=[
        "fits",
        "sleep-one",
        "sleep-both",
        "unload",
        "sleeping-is-not-enough",
        "unload-fewest",
        "busy",
        "higher",
        "not-enough",
    ],
)
def test_room_to_wake_sleeps_then_unloads_the_copies_beside_it(
    holders: dict[str, int],
    sleepable: set[str],
    sleepers: tuple[str, ...] | None,
    victims: tuple[str, ...] | None,
) -> None:
    """A 24 GiB card on which a sleeper holds 1 GiB of its 18 GiB budget: the others may
    keep 6 GiB there at most. Each copy put to sleep keeps a 1 GiB residue."""
    reservations = [held("sleeper", 1, budget_gib=18)]
    reservations += [held(name, gib) for name, gib in holders.items()]
    state = FleetState(fleet=Fleet(nodes=(node(memory_gib=64),)), reservations=tuple(reservations))
    found = room_to_wake(
        state,
        "sleeper",
        priority=0,
        candidates=[IDLE[name] for name in holders],
        residue_bytes={name: GIB for name in sleepable},
    )
    if sleepers is None:
        assert found is None
        return
    assert found is not None
    assert tuple(c.deployment for c in found.sleepers) == sleepers
    assert tuple(c.deployment for c in found.victims) == victims


def test_room_to_wake_looks_only_at_the_devices_it_sleeps_on() -> None:
    """Unloading the idle copy on the other card frees nothing the sleeper can take back."""
    other_card = Reservation(
        deployment="a",
        node="node-a",
        gpu_index=1,
        partition_index=None,
        reserved_bytes=10 * GIB,
    )
    state = FleetState(
        fleet=Fleet(nodes=(node(memory_gib=64, gpus=2),)),
        reservations=(held("sleeper", 1, budget_gib=18), held("high", 10), other_card),
    )
    found = room_to_wake(
        state,
        "sleeper",
        priority=0,
        candidates=[IDLE["a"], IDLE["high"]],
        residue_bytes={"a": GIB},
    )
    assert found is None
