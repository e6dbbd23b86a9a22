"""Measured memory as placement input: a slot's free budget is min(capacity − reserved,
measured free − reserved but untouched − headroom); memory held outside cohabit is named in
the NoFit; a pool's OS reserve absorbs what the OS itself uses, so nothing counts twice."""

from __future__ import annotations

import pytest

from cohabit.hardware.model import Fleet
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, MeasuredSlot, Measurement, Reservation
from cohabit.units import GIB
from tests.placement.fleets import cpu_host, gpu, node

CARD = Fleet(
    nodes=(
        node(
            "node-a",
            gpu(0, 48, product="L40S", version=None),
            gpu(1, 80, product="A100", version=None, mig=(("3g.40gb", 40),)),
        ),
    )
)
HOST = Fleet(nodes=(cpu_host("host", 32),))  # 8 GiB OS reserve: 24 free
GPU0 = ("node-a", 0, None)
MIG = ("node-a", 1, 0)
POOL = ("host", None, None)


def measured(
    slots: dict[tuple[str, int | None, int | None], MeasuredSlot], headroom: int = GIB
) -> Measurement:
    return Measurement(slots=slots, headroom_bytes=headroom)


@pytest.mark.parametrize(
    ("fleet", "reserved", "measurement", "free"),
    [
        pytest.param(CARD, 0, None, [48 * GIB, 40 * GIB], id="unmeasured: capacity"),
        pytest.param(
            CARD,
            0,
            measured({GPU0: MeasuredSlot(free_bytes=47 * GIB, foreign_bytes=GIB)}),
            [46 * GIB, 40 * GIB],
            id="idle card: free less headroom",
        ),
        pytest.param(
            CARD,
            0,
            measured({GPU0: MeasuredSlot(free_bytes=18 * GIB, foreign_bytes=30 * GIB)}),
            [17 * GIB, 40 * GIB],
            id="someone else holds 30 GiB",
        ),
        pytest.param(
            CARD,
            20 * GIB,
            measured(
                {
                    GPU0: MeasuredSlot(
                        free_bytes=40 * GIB, cohabit_bytes=4 * GIB, foreign_bytes=4 * GIB
                    )
                },
                headroom=0,
            ),
            [24 * GIB, 40 * GIB],
            id="an engine still loading: its untouched budget is not free",
        ),
        pytest.param(
            CARD,
            0,
            measured({MIG: MeasuredSlot(free_bytes=39 * GIB, foreign_bytes=GIB // 2)}),
            [48 * GIB, 40 * GIB],
            id="a slice with driver overhead within headroom is offered whole",
        ),
        pytest.param(
            CARD,
            0,
            measured({MIG: MeasuredSlot(free_bytes=35 * GIB, foreign_bytes=5 * GIB)}),
            [48 * GIB, 34 * GIB],
            id="a slice someone else uses is not offered whole",
        ),
        pytest.param(
            HOST,
            0,
            measured({POOL: MeasuredSlot(free_bytes=30 * GIB, foreign_bytes=2 * GIB)}),
            [24 * GIB],
            id="pool: the OS within its reserve counts once",
        ),
        pytest.param(
            HOST,
            0,
            measured({POOL: MeasuredSlot(free_bytes=20 * GIB, foreign_bytes=12 * GIB)}),
            [19 * GIB],
            id="pool: beyond the reserve it counts",
        ),
    ],
)
def test_free_budget_with_measured_figures(
    fleet: Fleet, reserved: int, measurement: Measurement | None, free: list[int]
) -> None:
    held = (
        (Reservation(deployment="d", node="node-a", gpu_index=0, partition_index=None,
                     reserved_bytes=reserved),)
        if reserved else ()
    )  # fmt: skip
    state = FleetState(fleet=fleet, reservations=held, measurement=measurement)
    assert state.free_bytes() == free


def test_a_no_fit_names_memory_held_outside_cohabit() -> None:
    state = FleetState(
        fleet=HOST,
        measurement=measured({POOL: MeasuredSlot(free_bytes=14 * GIB, foreign_bytes=18 * GIB)}),
    )
    decision = plan(state, PlacementRequest(name="m", vram_bytes=16 * GIB))
    assert isinstance(decision, NoFit)
    assert decision.message == (
        "0/1 nodes fit: 1 insufficient system memory (largest free 13 GiB on host cpu pool); "
        "18 GiB held by processes outside cohabit on host cpu pool"
    )
    assert decision.details()["foreign_bytes"] == 18 * GIB
    assert decision.details()["foreign_location"] == "host cpu pool"
    assert isinstance(plan(state.with_measurement(None), decision_request()), Placement)


def decision_request() -> PlacementRequest:
    return PlacementRequest(name="m", vram_bytes=16 * GIB)


def test_a_no_fit_without_foreign_memory_says_nothing_of_it() -> None:
    state = FleetState(
        fleet=HOST,
        measurement=measured({POOL: MeasuredSlot(free_bytes=30 * GIB, foreign_bytes=2 * GIB)}),
    )
    decision = plan(state, PlacementRequest(name="m", vram_bytes=30 * GIB))
    assert isinstance(decision, NoFit)
    assert "outside cohabit" not in decision.message
    assert decision.foreign_location is None
