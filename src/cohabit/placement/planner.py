"""The planner: one request at a time against the state the previous ones left (docs/placement.md).

`plan()` answers one request; `Planner` keeps a working index for many decisions in a row
(the online order of `plan_online()`, and the packings `batch.plan_batch()` tries). Nothing
here does I/O or reads a clock; callers commit reservations elsewhere.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cohabit.hardware.model import Fleet, HardwareClass, NoticeCode, Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.placement.decision import Allocation, Choice, Decision, Placement
from cohabit.placement.diagnosis import Diagnosis
from cohabit.placement.filters import capacity_filter, static_reason
from cohabit.placement.index import FreeIndex
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy, ScoreKey, score_key
from cohabit.placement.state import FleetState


@dataclass(frozen=True, slots=True)
class _Eligible:
    """Groups that pass the static filters for one kind of request, by tier: accelerators
    first, CPU pools only when no accelerator fits."""

    tiers: tuple[tuple[int, ...], ...]
    groups: frozenset[int]
    gpu_groups: tuple[int, ...]  # those of whole GPUs, which tensor-parallel shards take


class Planner:
    """Decides requests against a working copy of a `FleetState`.

    `place()` decides and commits; `decide()` only decides. `state` returns the fleet with
    everything committed so far.
    """

    def __init__(self, state: FleetState, *, policy: Policy = Policy.BINPACK) -> None:
        self.policy = policy
        self._base = state
        self.slots = state.slots
        node_count = len(state.fleet.nodes)
        self.index = FreeIndex(self.slots, state.free_bytes(), node_count)
        self._diagnosis = Diagnosis(self.slots, node_count, state.foreign_cuts())
        self._eligible: dict[tuple[object, ...], _Eligible] = {}
        self._committed: dict[str, Placement] = {}

    @property
    def state(self) -> FleetState:
        return self._base.with_reservations(
            r for placement in self._committed.values() for r in placement.reservations()
        )

    def place(self, request: PlacementRequest) -> Decision:
        decision = self.decide(request)
        if isinstance(decision, Placement):
            self.commit(decision)
        return decision

    def decide(self, request: PlacementRequest) -> Decision:
        eligible = self._eligible_groups(request)
        if request.tensor_parallel == 1:
            chosen = self._choose_single(request, eligible)
        else:
            chosen = self._choose_sharded(request, eligible)
        if chosen is None:
            return self._diagnosis.no_fit(request, self.index)
        return self._placement(request, chosen)

    def place_on(self, request: PlacementRequest, positions: Sequence[int]) -> Placement | None:
        """Place `request` on exactly these slots if every filter passes there; commit it."""
        if len(positions) != request.tensor_parallel or len(set(positions)) != len(positions):
            return None
        slots = [self.slots[p] for p in positions]
        if len({s.node for s in slots}) != 1:
            return None
        for slot in slots:
            if static_reason(request, slot) or capacity_filter(
                request, slot, self.index.free[slot.position]
            ):
                return None
        placement = self._placement(request, positions)
        self.commit(placement)
        return placement

    def commit(self, placement: Placement) -> None:
        for allocation in placement.allocations:
            position = allocation.slot.position
            self.index.set_free(position, self.index.free[position] - allocation.allocated_bytes)
        self._committed[placement.name] = placement

    def release(self, placement: Placement) -> None:
        for allocation in placement.allocations:
            position = allocation.slot.position
            self.index.set_free(position, self.index.free[position] + allocation.allocated_bytes)
        self._committed.pop(placement.name, None)

    def _eligible_groups(self, request: PlacementRequest) -> _Eligible:
        # What the static filters read of a request, as it was given: cheaper to key on
        # than the vendor set it resolves to (requests that resolve alike share the result).
        kind = (
            request.vendor,
            request.engine,
            request.min_accel_version,
            request.tensor_parallel > 1,
        )
        eligible = self._eligible.get(kind)
        if eligible is None:
            accelerators: list[int] = []
            cpu: list[int] = []
            for group_id, group in enumerate(self.index.groups):
                if static_reason(request, group.representative) is None:
                    is_cpu = group.representative.hardware_class is HardwareClass.CPU
                    (cpu if is_cpu else accelerators).append(group_id)
            groups = self.index.groups
            eligible = _Eligible(
                tiers=(tuple(accelerators), tuple(cpu)),
                groups=frozenset(accelerators + cpu),
                gpu_groups=tuple(g for g in accelerators + cpu if groups[g].key[2] is SlotKind.GPU),
            )
            self._eligible[kind] = eligible
        return eligible

    def _choose_single(self, request: PlacementRequest, eligible: _Eligible) -> list[int] | None:
        need = request.vram_bytes
        if self.policy is Policy.BINPACK:
            # The least (free, position) that fits is the best binpack score (bytes left,
            # then position) of the tier.
            for tier in eligible.tiers:
                hit = self.index.tightest(tier, need)
                if hit is not None:
                    return [hit[1]]
            return None
        for tier in eligible.tiers:
            best: tuple[ScoreKey, int] | None = None
            for group_id in tier:
                group = self.index.groups[group_id]
                hit = (
                    self.index.best_fit(group_id, need)
                    if group.key[2] is SlotKind.PARTITION
                    else self.index.largest(group_id)
                )
                if hit is None or hit[0] < need:
                    continue
                key = score_key(self.policy, hit[0] - need, hit[1])
                if best is None or key < best[0]:
                    best = (key, hit[1])
            if best is not None:
                return [best[1]]
        return None

    def _choose_sharded(self, request: PlacementRequest, eligible: _Eligible) -> list[int] | None:
        """N devices of one node and one vendor.

        Binpack walks the free budgets that fit, smallest first, across the eligible groups:
        a node first met at free f leaves at least N × (f − need) after placement, so the walk
        stops once that bound (with the node order as tie-break) passes the best node scored.
        Spread scores every node whose N-th largest free GPU budget fits. A node whose GPUs
        all pass the static filters is scored from its sorted free values alone; only the
        winner's devices are looked up.
        """
        need, shards = request.vram_bytes, request.tensor_parallel
        index = self.index
        best: tuple[ScoreKey, int, list[int] | None] | None = None
        if self.policy is Policy.BINPACK:
            walk = heapq.merge(*(index.fits_ascending(g, need) for g in eligible.gpu_groups))
            seen: set[int] = set()
            for free, position in walk:
                node_order = self.slots[position].node_order
                if best is not None and (shards * (free - need), node_order) > best[0]:
                    break
                if node_order in seen:
                    continue
                seen.add(node_order)
                if index.kth_largest_free(node_order, shards) < need:
                    continue
                best = self._better(best, node_order, request, eligible)
        else:
            for node_order in index.tp_candidate_nodes(shards, need):
                best = self._better(best, node_order, request, eligible)
        if best is None:
            return None
        if best[2] is not None:
            return best[2]
        fits = [(index.free[p], p) for p in index.node_gpus[best[1]] if index.free[p] >= need]
        return sorted(p for _, p in self._pick(fits, shards))

    def _better(
        self,
        best: tuple[ScoreKey, int, list[int] | None] | None,
        node_order: int,
        request: PlacementRequest,
        eligible: _Eligible,
    ) -> tuple[ScoreKey, int, list[int] | None] | None:
        """`best`, or this node if it holds the request with a better score."""
        need, shards = request.vram_bytes, request.tensor_parallel
        index = self.index
        if index.node_uniform[node_order] and index.node_groups[node_order] <= eligible.groups:
            ascending = index.node_free_ascending(node_order)
            first_fit = bisect_left(ascending, need)
            if len(ascending) - first_fit < shards:
                return best
            if self.policy is Policy.BINPACK:
                values = ascending[first_fit : first_fit + shards]
            else:
                values = ascending[-shards:]
            key = score_key(self.policy, sum(values) - shards * need, node_order)
            return (key, node_order, None) if best is None or key < best[0] else best
        for fits in self._fits_by_vendor(node_order, need, eligible).values():
            if len(fits) >= shards:
                chosen = self._pick(fits, shards)
                key = score_key(self.policy, sum(f - need for f, _ in chosen), node_order)
                if best is None or key < best[0]:
                    best = (key, node_order, sorted(p for _, p in chosen))
        return best

    def _fits_by_vendor(
        self, node_order: int, need: int, eligible: _Eligible
    ) -> dict[Vendor, list[tuple[int, int]]]:
        free, group_of = self.index.free, self.index.group_of
        by_vendor: dict[Vendor, list[tuple[int, int]]] = {}
        for position in self.index.node_gpus[node_order]:
            if group_of[position] in eligible.groups and free[position] >= need:
                vendor = self.slots[position].vendor
                by_vendor.setdefault(vendor, []).append((free[position], position))
        return by_vendor

    def _pick(self, fits: list[tuple[int, int]], shards: int) -> list[tuple[int, int]]:
        """Binpack takes the N tightest fits, spread the N roomiest; ties to the lower index."""
        if self.policy is Policy.BINPACK:
            return sorted(fits)[:shards]
        return sorted(fits, key=lambda entry: (-entry[0], entry[1]))[:shards]

    def _placement(self, request: PlacementRequest, positions: Sequence[int]) -> Placement:
        need, free, slots = request.vram_bytes, self.index.free, self.slots
        allocations: list[Allocation] = []
        left_bytes = 0
        notices: list[NoticeCode] = []
        for position in positions:
            slot = slots[position]
            allocated = slot.capacity_bytes if slot.exclusive else need
            allocations.append(Allocation(slot=slot, allocated_bytes=allocated))
            left_bytes += free[position] - allocated
            for code in slot.notices:
                if code not in notices:
                    notices.append(code)
        first = allocations[0].slot
        return Placement(
            name=request.name,
            request=request,
            node=first.node,
            allocations=tuple(allocations),
            notices=tuple(notices),
            choice=Choice(
                policy=self.policy,
                left_bytes=left_bytes,
                # Only a CPU pool's reason needs it: the other tiers go unasked.
                accelerators_eligible=(
                    first.hardware_class is HardwareClass.CPU
                    and bool(self._eligible_groups(request).tiers[0])
                ),
            ),
        )


def plan(
    state: FleetState, request: PlacementRequest, *, policy: Policy = Policy.BINPACK
) -> Decision:
    """Decide one request against `state`; nothing is committed anywhere."""
    return Planner(state, policy=policy).decide(request)


def never_fits(fleet: Fleet, request: PlacementRequest) -> NoFit | None:
    """The refusal `request` gets on `fleet` with nothing reserved — one no amount of
    waiting clears (kube-scheduler's UnschedulableAndUnresolvable) — or None when it fits
    an empty fleet, so a refusal now may clear once budgets free up. Admission and the
    Kubernetes operator both ask this before they call a refusal final."""
    decision = plan(FleetState(fleet=fleet), request)
    return decision if isinstance(decision, NoFit) else None


def plan_online(
    state: FleetState, requests: Iterable[PlacementRequest], *, policy: Policy = Policy.BINPACK
) -> list[Decision]:
    """Place requests one at a time, in the order given, each against what the previous left."""
    planner = Planner(state, policy=policy)
    return [planner.place(request) for request in requests]
