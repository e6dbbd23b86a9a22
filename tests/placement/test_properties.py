"""Invariants over random fleets and request sequences (hypothesis): no device is ever
over-reserved, whole-GPU and partition devices never hold two models, the indexed planner
decides exactly as a planner that scans every device, and batch places at least as many as
online order."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cohabit.hardware.model import (
    Fleet,
    Gpu,
    HardwareClass,
    Node,
    Partition,
    Topology,
    Vendor,
)
from cohabit.placement.batch import plan_batch
from cohabit.placement.decision import Decision, Placement
from cohabit.placement.filters import capacity_filter, static_reason
from cohabit.placement.planner import Planner, plan_online
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.units import GIB

SIZES_GIB = [8, 16, 24, 40, 80]
VERSIONS = ["11.8", "12.4", "12.10"]


@st.composite
def gpus(draw: st.DrawFn, index: int) -> Gpu:
    memory = draw(st.sampled_from(SIZES_GIB)) * GIB
    vendor = draw(st.sampled_from([Vendor.NVIDIA, Vendor.NVIDIA, Vendor.AMD]))
    partitions: tuple[Partition, ...] = ()
    if memory >= 40 * GIB and draw(st.booleans()):
        sizes = draw(st.lists(st.sampled_from([5, 10, 20]), min_size=1, max_size=3))
        if sum(sizes) * GIB <= memory:
            partitions = tuple(Partition(profile=f"p{s}", memory_bytes=s * GIB) for s in sizes)
    return Gpu(
        index=index,
        vendor=vendor,
        product="gpu",
        memory_bytes=memory,
        accel_version=draw(st.sampled_from(VERSIONS)),
        partitions=partitions,
    )


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    kind = draw(st.sampled_from(["discrete", "discrete", "discrete", "unified", "cpu"]))
    if kind == "unified":
        return Node(
            name=name,
            unified_memory_bytes=draw(st.sampled_from([32, 64, 128])) * GIB,
            gpus=(Gpu(index=0, vendor=Vendor.NVIDIA, product="GB10", accel_version="13.0"),),
        )
    if kind == "cpu":
        return Node(name=name, memory_bytes=draw(st.sampled_from([16, 32, 64])) * GIB)
    count = draw(st.integers(min_value=1, max_value=4))
    return Node(
        name=name,
        gpus=tuple(draw(gpus(i)) for i in range(count)),
        sharing_configured=draw(st.sampled_from([None, True, False])),
        schedulable=draw(st.sampled_from([True, True, True, False])),
    )


@st.composite
def fleet_states(draw: st.DrawFn) -> FleetState:
    count = draw(st.integers(min_value=1, max_value=4))
    fleet = Fleet(
        topology=draw(st.sampled_from(list(Topology))),
        fractional=draw(st.booleans()),
        sharing_configured=draw(st.booleans()),
        nodes=tuple(draw(nodes(f"n{i}")) for i in range(count)),
    )
    return FleetState(fleet=fleet)


@st.composite
def request_lists(draw: st.DrawFn) -> list[PlacementRequest]:
    count = draw(st.integers(min_value=1, max_value=12))
    return [
        PlacementRequest(
            name=f"r{i}",
            vram_bytes=draw(st.integers(min_value=1, max_value=48)) * GIB // 2,
            tensor_parallel=draw(st.sampled_from([1, 1, 1, 2, 3])),
            vendor=draw(st.sampled_from([None, None, Vendor.NVIDIA, Vendor.AMD, Vendor.CPU])),
            min_accel_version=draw(st.sampled_from([None, None, "12.1", "12.9"])),
            engine=draw(st.sampled_from([None, None, "llamacpp", "vllm"])),
        )
        for i in range(count)
    ]


def assert_within_capacity(state: FleetState, decisions: list[Decision]) -> None:
    final = state.with_reservations(
        r for d in decisions if isinstance(d, Placement) for r in d.reservations()
    )
    used = final.used_bytes()
    holders = Counter(r.slot_key for r in final.reservations)
    for slot in final.slots:
        assert used.get(slot.key, 0) <= slot.capacity_bytes, slot.location
        if slot.exclusive:
            assert holders[slot.key] <= 1, f"{slot.location} holds {holders[slot.key]} models"
        if slot.hardware_class is HardwareClass.HARDWARE_ISOLATED:
            assert slot.exclusive


def reference_decision(planner: Planner, request: PlacementRequest) -> list[int] | None:
    """Scan every slot (what the index must agree with): binpack, CPU pools last."""
    free = planner.index.free
    need = request.vram_bytes
    passing = [
        s
        for s in planner.slots
        if static_reason(request, s) is None
        and capacity_filter(request, s, free[s.position]) is None
    ]
    if request.tensor_parallel == 1:
        for tier in (False, True):
            fits = [s for s in passing if (s.hardware_class is HardwareClass.CPU) is tier]
            if fits:
                best = min(fits, key=lambda s: (free[s.position] - need, s.position))
                return [best.position]
        return None
    best_key, best = None, None
    for node_order in range(len(planner.index.node_gpus)):
        by_vendor: dict[Vendor, list[int]] = {}
        for s in passing:
            if s.node_order == node_order:
                by_vendor.setdefault(s.vendor, []).append(s.position)
        for positions in by_vendor.values():
            if len(positions) >= request.tensor_parallel:
                chosen = sorted(positions, key=lambda p: (free[p], p))[: request.tensor_parallel]
                key = (sum(free[p] - need for p in chosen), node_order)
                if best_key is None or key < best_key:
                    best_key, best = key, sorted(chosen)
    return best


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_states(), request_lists())
def test_online_never_over_reserves_and_matches_a_full_scan(
    state: FleetState, requests: list[PlacementRequest]
) -> None:
    planner = Planner(state)
    decisions: list[Decision] = []
    for request in requests:
        expected = reference_decision(planner, request)
        decision = planner.place(request)
        if expected is None:
            assert isinstance(decision, NoFit)
        else:
            assert isinstance(decision, Placement)
            assert [a.slot.position for a in decision.allocations] == expected
        decisions.append(decision)
    assert_within_capacity(state, decisions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet_states(), request_lists())
def test_batch_places_at_least_as_many_as_online(
    state: FleetState, requests: list[PlacementRequest]
) -> None:
    online = plan_online(state, requests)
    batch = plan_batch(state, requests)
    assert [d.name for d in batch] == [r.name for r in requests]
    assert sum(d.placed for d in batch) >= sum(d.placed for d in online)
    assert_within_capacity(state, batch)


def brute_force_most_placed(state: FleetState, requests: list[PlacementRequest]) -> int:
    """Try every assignment of single-device requests to slots (or to nowhere)."""
    slots = [s for s in state.slots if s.schedulable]
    free = [s.capacity_bytes for s in slots]
    best = 0

    def assign(k: int, placed: int) -> None:
        nonlocal best
        best = max(best, placed)
        if k == len(requests) or placed + len(requests) - k <= best:
            return
        need = requests[k].vram_bytes
        for j, slot in enumerate(slots):
            if slot.exclusive:
                if free[j] == slot.capacity_bytes and need <= slot.capacity_bytes:
                    free[j] = 0
                    assign(k + 1, placed + 1)
                    free[j] = slot.capacity_bytes
            elif free[j] >= need:
                free[j] -= need
                assign(k + 1, placed + 1)
                free[j] += need
        assign(k + 1, placed)

    assign(0, 0)
    return best


@st.composite
def small_uniform_instances(draw: st.DrawFn) -> tuple[FleetState, list[PlacementRequest]]:
    gpus_drawn = []
    for index in range(draw(st.integers(min_value=1, max_value=3))):
        memory = draw(st.sampled_from([8, 12, 16, 24])) * GIB
        partitions: tuple[Partition, ...] = ()
        if draw(st.integers(min_value=0, max_value=3)) == 0:
            partitions = (Partition(profile="half", memory_bytes=memory // 2),)
        gpus_drawn.append(
            Gpu(
                index=index,
                vendor=Vendor.NVIDIA,
                product="g",
                memory_bytes=memory,
                partitions=partitions,
            )
        )
    fleet = Fleet(nodes=(Node(name="n", gpus=tuple(gpus_drawn)),))
    sizes = draw(st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=7))
    requests = [
        PlacementRequest(name=f"r{i}", vram_bytes=size * GIB // 2) for i, size in enumerate(sizes)
    ]
    return FleetState(fleet=fleet), requests


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_uniform_instances())
def test_batch_places_the_most_possible_on_small_instances(
    instance: tuple[FleetState, list[PlacementRequest]],
) -> None:
    state, requests = instance
    batch = plan_batch(state, requests)
    assert sum(d.placed for d in batch) == brute_force_most_placed(state, requests)
    assert_within_capacity(state, batch)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_indexed_planner_matches_a_full_scan_on_a_busy_fleet(seed: int) -> None:
    """Hundreds of decisions on 40 mixed nodes until the fleet is full: the index's early
    stops (tensor-parallel walk, group bisection) must agree with scanning every device."""
    rng = random.Random(seed)
    fleet_nodes = []
    for n in range(40):
        vendor = rng.choice([Vendor.NVIDIA, Vendor.NVIDIA, Vendor.AMD])
        sizes = [rng.choice(SIZES_GIB) for _ in range(rng.choice([1, 2, 4, 8]))]
        gpus_list = tuple(
            Gpu(
                index=i,
                vendor=vendor if rng.random() < 0.9 else Vendor.AMD,
                product="gpu",
                memory_bytes=size * GIB,
                accel_version=rng.choice(VERSIONS),
            )
            for i, size in enumerate(sizes)
        )
        fleet_nodes.append(Node(name=f"n{n}", gpus=gpus_list))
    state = FleetState(fleet=Fleet(nodes=tuple(fleet_nodes)))
    planner = Planner(state)
    for i in range(600):
        request = PlacementRequest(
            name=f"r{i}",
            vram_bytes=rng.randint(1, 60) * GIB // 2,
            tensor_parallel=rng.choice([1, 1, 1, 2, 4]),
            vendor=rng.choice([None, Vendor.NVIDIA, Vendor.AMD]),
            min_accel_version=rng.choice([None, "12.4"]),
        )
        expected = reference_decision(planner, request)
        decision = planner.place(request)
        got = (
            [a.slot.position for a in decision.allocations]
            if isinstance(decision, Placement)
            else None
        )
        assert got == expected, request
