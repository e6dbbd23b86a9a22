"""A placement says why the planner chose it (a deployment's timeline shows the sentence): the
rule that picked the slot and what it leaves free, a partition or a whole GPU taken whole,
and why a CPU pool when the request lands on one."""

from __future__ import annotations

import pytest

from cohabit.hardware.model import Vendor
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import GIB
from tests.placement.fleets import cpu_host, gpu, node, req, state


def held(base: FleetState, gib: float) -> FleetState:
    """`base` with `gib` already reserved on its node-a gpu 0."""
    taken = Reservation(
        deployment="other", node="node-a", gpu_index=0, partition_index=None,
        reserved_bytes=int(gib * GIB),
    )  # fmt: skip
    return base.with_reservations([taken])


TWO_CARDS = node("node-a", gpu(0, 16), gpu(1, 24))


@pytest.mark.parametrize(
    ("fleet_state", "request_", "policy", "where", "why"),
    [
        pytest.param(
            state(TWO_CARDS), req("a", 6), Policy.BINPACK, "node-a gpu 0",
            "binpack: the tightest fit, leaving 10 GiB of 16 GiB free",
            id="binpack-tightest-card",
        ),
        pytest.param(
            held(state(TWO_CARDS), 4), req("a", 6), Policy.BINPACK, "node-a gpu 0",
            "binpack: the tightest fit, leaving 6 GiB of 16 GiB free",
            id="binpack-counts-what-others-hold",
        ),
        pytest.param(
            state(TWO_CARDS), req("a", 6), Policy.SPREAD, "node-a gpu 1",
            "spread: the most room, leaving 18 GiB of 24 GiB free",
            id="spread-roomiest-card",
        ),
        pytest.param(
            state(node("node-a", gpu(0, 16), gpu(1, 16))), req("tp", 6, tensor_parallel=2),
            Policy.BINPACK, "node-a gpu 0",
            "binpack: the tightest fit of 2 GPUs, leaving 20 GiB of 32 GiB free",
            id="tensor-parallel-sums-its-devices",
        ),
        pytest.param(
            state(node("h100", gpu(0, 80, mig=(("1g.10gb", 10), ("3g.40gb", 40))))),
            req("a", 8), Policy.BINPACK, "h100 gpu 0 mig 1g.10gb #0",
            "the smallest free partition that holds 8 GiB, taken whole",
            id="mig-smallest-partition",
        ),
        pytest.param(
            state(node("n", gpu(0, 16)), fractional=False), req("a", 6), Policy.BINPACK,
            "n gpu 0", "a GPU with nothing on it, taken whole (whole_gpu: not shared)",
            id="fractional-off-whole-gpu",
        ),
        pytest.param(
            state(node("node-a", gpu(0, 4)), cpu_host("box", 24)), req("a", 6),
            Policy.BINPACK, "box cpu pool",
            "binpack: the tightest fit, leaving 10 GiB of 16 GiB free; no accelerator had "
            "room, so the CPU pool takes it",
            id="cpu-fallback-when-no-gpu-has-room",
        ),
        pytest.param(
            state(cpu_host("box", 24)), req("a", 6), Policy.BINPACK, "box cpu pool",
            "binpack: the tightest fit, leaving 10 GiB of 16 GiB free; no accelerator here "
            "can run it, so the CPU pool takes it",
            id="cpu-only-host",
        ),
        pytest.param(
            state(node("node-a", gpu(0, 16)), cpu_host("box", 24)),
            req("a", 6, vendor=Vendor.CPU), Policy.BINPACK, "box cpu pool",
            "binpack: the tightest fit, leaving 10 GiB of 16 GiB free; the CPU was asked for",
            id="cpu-asked-for",
        ),
    ],
)  # fmt: skip
def test_a_placement_says_why(
    fleet_state: FleetState, request_: PlacementRequest, policy: Policy, where: str, why: str
) -> None:
    decision = plan(fleet_state, request_, policy=policy)
    assert isinstance(decision, Placement), decision
    assert decision.first.location == where
    assert decision.why == why


def test_the_reason_is_not_part_of_what_the_placement_is() -> None:
    """A placement rebuilt from held reservations (no reason) equals the planner's own."""
    decision = plan(state(TWO_CARDS), req("a", 6))
    assert isinstance(decision, Placement) and decision.why
    rebuilt = Placement(
        name=decision.name, request=decision.request, node=decision.node,
        allocations=decision.allocations, notices=decision.notices,
    )  # fmt: skip
    assert rebuilt == decision and rebuilt.why == ""
