"""The planner's contract (docs/placement.md), as tables: each case places requests in order on a
fleet and checks where each landed — a slot location, or the NoFit reason."""

from __future__ import annotations

import pytest

from cohabit.hardware.model import HardwareClass, SharingStrategy, Topology, Vendor
from cohabit.placement.decision import Decision, Placement
from cohabit.placement.planner import never_fits, plan, plan_online
from cohabit.placement.reasons import NoFit, NoFitReason
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import GIB
from tests.placement.fleets import cpu_host, gpu, node, req, state, unified


def where(decision: Decision) -> str:
    if isinstance(decision, Placement):
        if len(decision.allocations) > 1:
            return f"{decision.node} gpus {','.join(map(str, decision.gpu_indices))}"
        return decision.first.location
    return decision.reason.value


T4 = node("node-a", gpu(0, 16, product="Tesla T4"))
MIXED = node("node-a", gpu(0, 8), gpu(1, 24))

SEED_CASES = [
    pytest.param(
        state(T4),
        [req("a", 6), req("b", 6), req("c", 6)],
        ["node-a gpu 0", "node-a gpu 0", "insufficient_capacity"],
        id="seed-two-6gb-share-a-t4-third-fails",
    ),
    pytest.param(
        state(MIXED),
        [req("big", 10)],
        ["node-a gpu 1"],
        id="seed-10gb-goes-to-24gb-card-though-8gb-idle",
    ),
    pytest.param(
        state(unified("spark", 128)),
        [req("fits-pool-minus-reserve", 120), req("one-more-byte", 0.001)],
        ["spark unified pool", "insufficient_system_memory"],
        id="seed-unified-node-keeps-8gib-reserve",
    ),
    pytest.param(
        state(node("h100", gpu(0, 80, mig=(("1g.10gb", 10),)))),
        [req("a", 4), req("b", 4)],
        ["h100 gpu 0 mig 1g.10gb #0", "insufficient_capacity"],
        id="seed-mig-slice-holds-one-model",
    ),
]

RULE_CASES = [
    pytest.param(
        state(node("n", gpu(0, 24), gpu(1, 16), gpu(2, 40))),
        [req("a", 10)],
        ["n gpu 1"],
        id="binpack-least-left",
    ),
    pytest.param(
        state(node("n", gpu(0, 16), gpu(1, 16)), node("m", gpu(0, 16))),
        [req("a", 4), req("b", 4)],
        ["n gpu 0", "n gpu 0"],
        id="binpack-ties-go-to-node-order-then-lowest-index",
    ),
    pytest.param(
        state(node("n", gpu(0, 40, mig=(("3g.20gb", 20), ("2g.10gb", 10), ("1g.5gb", 5))))),
        [req("a", 4), req("b", 4), req("c", 4), req("d", 4)],
        [
            "n gpu 0 mig 1g.5gb #2",
            "n gpu 0 mig 2g.10gb #1",
            "n gpu 0 mig 3g.20gb #0",
            "insufficient_capacity",
        ],
        id="mig-smallest-fitting-empty-partition",
    ),
    pytest.param(
        state(node("n", gpu(0, 16)), fractional=False),
        [req("a", 2), req("b", 2)],
        ["n gpu 0", "insufficient_capacity"],
        id="whole-gpu-mode-first-model-claims-the-card",
    ),
    pytest.param(
        state(
            node("n", gpu(0, 16)),
            topology=Topology.MANAGED_CLUSTER,
            sharing_configured=False,
        ),
        [req("a", 2), req("b", 2)],
        ["n gpu 0", "sharing_not_configured"],
        id="managed-without-sharing-whole-gpu-then-sharing-not-configured",
    ),
    pytest.param(
        state(
            node("n", gpu(0, 16)),
            topology=Topology.MANAGED_CLUSTER,
            sharing_configured=False,
        ),
        [req("a", 2), req("too-big-for-any-card", 20)],
        ["n gpu 0", "insufficient_capacity"],
        id="managed-without-sharing-but-card-too-small-is-capacity",
    ),
    pytest.param(
        state(node("n", gpu(0, 40), gpu(1, 40)), node("m", gpu(0, 40))),
        [req("tp", 30, tensor_parallel=2)],
        ["n gpus 0,1"],
        id="tensor-parallel-two-devices-one-node",
    ),
    pytest.param(
        state(node("n", gpu(0, 40)), node("m", gpu(0, 40))),
        [req("tp", 10, tensor_parallel=2)],
        ["insufficient_gpu_count"],
        id="tensor-parallel-never-spans-nodes",
    ),
    pytest.param(
        state(node("n", gpu(0, 40, mig=(("3g.20gb", 20), ("3g.20gb", 20))), gpu(1, 40))),
        [req("tp", 10, tensor_parallel=2)],
        ["insufficient_gpu_count"],
        id="tensor-parallel-not-on-partitions",
    ),
    pytest.param(
        state(node("n", gpu(0, 24), gpu(1, 24, vendor=Vendor.AMD, version="6.2"))),
        [req("tp", 10, tensor_parallel=2)],
        ["insufficient_gpu_count"],
        id="tensor-parallel-never-mixes-vendors",
    ),
    pytest.param(
        state(node("n", gpu(0, 24), gpu(1, 16), gpu(2, 48), gpu(3, 16))),
        [req("tp", 12, tensor_parallel=2)],
        ["n gpus 1,3"],
        id="tensor-parallel-binpack-smallest-sum-left",
    ),
    pytest.param(
        state(node("n", gpu(0, 24, vendor=Vendor.AMD, version="6.2"))),
        [req("a", 4, vendor=Vendor.NVIDIA)],
        ["vendor_mismatch"],
        id="vendor-mismatch",
    ),
    pytest.param(
        state(node("n", gpu(0, 24))),
        [req("a", 4, engine="mlx")],
        ["vendor_mismatch"],
        id="engine-implies-vendor",
    ),
    pytest.param(
        state(node("n", gpu(0, 24, version="12.9")), node("m", gpu(0, 24, version="12.10"))),
        [req("a", 4, min_accel_version="12.10")],
        ["m gpu 0"],
        id="accel-version-compares-numerically",
    ),
    pytest.param(
        state(node("n", gpu(0, 24, version="11.8"))),
        [req("a", 4, min_accel_version="12.1")],
        ["accel_version_unmet"],
        id="accel-version-unmet",
    ),
    pytest.param(
        state(
            node("n", gpu(0, 80, mig=(("7g.80gb", 80),)), schedulable=False),
            node("m", gpu(0, 16)),
        ),
        [req("a", 20)],
        ["insufficient_capacity"],
        id="node-mid-mig-reconfiguration-gets-nothing",
    ),
    pytest.param(
        state(cpu_host("cpu", 64), node("n", gpu(0, 24))),
        [req("a", 20)],
        ["n gpu 0"],
        id="cpu-pool-only-when-no-accelerator-fits",
    ),
    pytest.param(
        state(cpu_host("cpu", 64), node("n", gpu(0, 24))),
        [req("a", 30)],
        ["cpu cpu pool"],
        id="cpu-pool-takes-what-no-gpu-can",
    ),
    pytest.param(
        state(cpu_host("cpu", 24)),
        [req("a", 10), req("b", 10)],
        ["cpu cpu pool", "insufficient_system_memory"],
        id="cpu-pool-keeps-its-reserve",
    ),
    pytest.param(
        state(unified("mac", 64, vendor=Vendor.APPLE, os="macos"), node("n", gpu(0, 24))),
        [req("a", 10, engine="mlx")],
        ["mac unified pool"],
        id="mlx-goes-to-apple",
    ),
]

RULE_CASES_SPREAD = [
    pytest.param(
        state(node("n", gpu(0, 24), gpu(1, 16), gpu(2, 40))),
        [req("a", 10), req("b", 10)],
        ["n gpu 2", "n gpu 2"],
        id="spread-most-left",
    ),
    pytest.param(
        state(node("n", gpu(0, 40, mig=(("3g.20gb", 20), ("1g.5gb", 5)))), node("m", gpu(0, 8))),
        [req("a", 4)],
        ["m gpu 0"],
        id="spread-prefers-shared-card-with-most-left",
    ),
    pytest.param(
        state(node("n", gpu(0, 40, mig=(("3g.20gb", 20), ("1g.5gb", 5))))),
        [req("a", 4)],
        ["n gpu 0 mig 1g.5gb #1"],
        id="spread-still-picks-smallest-partition",
    ),
]


@pytest.mark.parametrize(("fleet_state", "requests", "expected"), SEED_CASES + RULE_CASES)
def test_binpack_rules(fleet_state: FleetState, requests: list, expected: list[str]) -> None:
    decisions = plan_online(fleet_state, requests)
    assert [where(d) for d in decisions] == expected


@pytest.mark.parametrize(("fleet_state", "requests", "expected"), RULE_CASES_SPREAD)
def test_spread_rules(fleet_state: FleetState, requests: list, expected: list[str]) -> None:
    decisions = plan_online(fleet_state, requests, policy=Policy.SPREAD)
    assert [where(d) for d in decisions] == expected


REASON_PRECEDENCE = [
    pytest.param(
        state(node("n", gpu(0, 8, vendor=Vendor.AMD, version="6.0"))),
        req("x", 100, vendor=Vendor.NVIDIA, min_accel_version="13.0", tensor_parallel=2),
        NoFitReason.VENDOR_MISMATCH,
        id="vendor-first",
    ),
    pytest.param(
        state(node("n", gpu(0, 8, version="12.0"))),
        req("x", 100, vendor=Vendor.NVIDIA, min_accel_version="13.0", tensor_parallel=2),
        NoFitReason.ACCEL_VERSION_UNMET,
        id="then-accel-version",
    ),
    pytest.param(
        state(node("n", gpu(0, 8)), topology=Topology.MANAGED_CLUSTER, sharing_configured=False),
        req("x", 100, tensor_parallel=2),
        NoFitReason.INSUFFICIENT_GPU_COUNT,
        id="then-gpu-count",
    ),
    pytest.param(
        FleetState(
            fleet=state(
                node("n", gpu(0, 16)), topology=Topology.MANAGED_CLUSTER, sharing_configured=False
            ).fleet,
            reservations=(
                Reservation(
                    deployment="d",
                    node="n",
                    gpu_index=0,
                    partition_index=None,
                    reserved_bytes=16 * GIB,
                ),
            ),
        ),
        req("x", 4),
        NoFitReason.SHARING_NOT_CONFIGURED,
        id="then-sharing-not-configured",
    ),
    pytest.param(
        state(unified("spark", 16), cpu_host("cpu", 16)),
        req("x", 12),
        NoFitReason.INSUFFICIENT_SYSTEM_MEMORY,
        id="then-system-memory-when-only-pools-remain",
    ),
    pytest.param(
        state(unified("spark", 16), node("n", gpu(0, 8))),
        req("x", 12),
        NoFitReason.INSUFFICIENT_CAPACITY,
        id="otherwise-capacity",
    ),
]


@pytest.mark.parametrize(("fleet_state", "request_", "reason"), REASON_PRECEDENCE)
def test_reason_precedence(fleet_state: FleetState, request_, reason: NoFitReason) -> None:
    decision = plan(fleet_state, request_)
    assert isinstance(decision, NoFit)
    assert decision.reason is reason


def test_no_fit_details_name_the_largest_free_budget_and_count_nodes() -> None:
    fleet_state = state(
        node("node-a", gpu(0, 16)),
        node("node-b", gpu(0, 24, vendor=Vendor.AMD, version="6.2")),
        node("node-c", gpu(0, 8)),
    )
    decisions = plan_online(fleet_state, [req("a", 12), req("b", 12, vendor=Vendor.NVIDIA)])
    no_fit = decisions[1]
    assert isinstance(no_fit, NoFit)
    assert no_fit.reason is NoFitReason.INSUFFICIENT_CAPACITY
    assert no_fit.largest_free_bytes == 8 * GIB
    assert no_fit.largest_free_location == "node-c gpu 0"
    assert no_fit.message == (
        "0/3 nodes fit: 2 insufficient GPU memory (largest free 8 GiB on node-c gpu 0), "
        "1 vendor mismatch"
    )
    details = no_fit.details()
    assert details["requested_bytes"] == 12 * GIB
    assert details["candidates_considered"] == 3
    assert details["candidates_filtered"] == {"insufficient GPU memory": 2, "vendor mismatch": 1}


def test_placement_fields_and_notices() -> None:
    fleet_state = state(
        node("n", gpu(0, 16), sharing_configured=False), topology=Topology.MANAGED_CLUSTER
    )
    decision = plan(fleet_state, req("a", 6))
    assert isinstance(decision, Placement)
    assert decision.fields() == {
        "node": "n",
        "gpu_indices": [0],
        "partition": None,
        "hardware_class": "software_shared",
        "sharing_class": "whole_gpu",
        "allocated_bytes": 16 * GIB,
        "allocated_capacity_gb": 16,
        "notices": ["SharingNotConfigured"],
    }


@pytest.mark.parametrize(
    ("sharing", "replicas", "expected"),
    [
        (SharingStrategy.TIME_SLICING, 4, "time_slicing_4replicas"),
        (SharingStrategy.MPS, None, "mps"),
        (None, None, "fractional"),
    ],
)
def test_admin_sharing_strategy_names_the_sharing_class(sharing, replicas, expected) -> None:
    fleet_state = state(
        node("n", gpu(0, 16), sharing_strategy=sharing, sharing_replicas=replicas),
        topology=Topology.MANAGED_CLUSTER,
    )
    first, second = plan_online(fleet_state, [req("a", 6), req("b", 6)])
    assert isinstance(first, Placement) and isinstance(second, Placement)
    assert first.sharing_class == expected
    assert first.hardware_class is HardwareClass.SOFTWARE_SHARED
    assert first.allocated_bytes == 6 * GIB


def test_pools_report_no_gpu_indices_and_partitions_report_their_profile() -> None:
    fleet_state = state(unified("spark", 128), node("a100", gpu(0, 40, mig=(("3g.20gb", 20),))))
    pool, mig = plan_online(fleet_state, [req("a", 110), req("b", 15)])
    assert isinstance(pool, Placement) and isinstance(mig, Placement)
    assert pool.gpu_indices == [] and pool.sharing_class == "unified_memory"
    assert mig.partition == "3g.20gb" and mig.sharing_class == "mig_3g_20gb"
    assert mig.allocated_bytes == 20 * GIB


def test_existing_reservations_count_and_over_reserved_devices_have_nothing_free() -> None:
    base = state(node("n", gpu(0, 16), gpu(1, 16)))
    held = base.with_reservations(
        [
            Reservation(
                deployment="x", node="n", gpu_index=0, partition_index=None, reserved_bytes=20 * GIB
            ),
            Reservation(
                deployment="y", node="n", gpu_index=1, partition_index=None, reserved_bytes=10 * GIB
            ),
        ]
    )
    assert held.free_bytes() == [0, 6 * GIB]
    decision = plan(held, req("a", 6))
    assert where(decision) == "n gpu 1"
    assert where(plan(held.without("y"), req("a", 16))) == "n gpu 1"


def test_with_reservations_returns_a_new_state() -> None:
    base = state(node("n", gpu(0, 16)))
    decision = plan(base, req("a", 6))
    assert isinstance(decision, Placement)
    after = base.with_reservations(decision.reservations())
    assert base.free_bytes() == [16 * GIB]
    assert after.free_bytes() == [10 * GIB]
    assert after.reservations[0].deployment == "a"


@pytest.mark.parametrize(
    ("request_", "final"),
    [
        pytest.param(req("fits-once-freed", 10), None, id="busy-now-fits-empty"),
        pytest.param(req("too-big", 20), "insufficient_capacity", id="bigger-than-any-card"),
        pytest.param(req("wrong-vendor", 4, vendor=Vendor.AMD), "vendor_mismatch", id="vendor"),
        pytest.param(req("tp-3", 4, tensor_parallel=3), "insufficient_gpu_count", id="tp"),
    ],
)
def test_never_fits_asks_the_empty_fleet(request_: PlacementRequest, final: str | None) -> None:
    """The rule admission and the Kubernetes operator share: a refusal is final only when
    the request would not fit even with nothing reserved."""
    busy = state(T4).fleet
    held = FleetState(
        fleet=busy,
        reservations=(Reservation(deployment="x", node="node-a", gpu_index=0,
                                  partition_index=None, reserved_bytes=12 * GIB),),
    )  # fmt: skip
    assert isinstance(plan(held, request_), NoFit)
    refusal = never_fits(busy, request_)
    assert (None if refusal is None else refusal.reason.value) == final
