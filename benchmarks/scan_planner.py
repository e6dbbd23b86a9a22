"""The baseline the index must beat: a planner that, for every request, runs every filter on
every device of the fleet (GPUStack-style) and builds its NoFit from the per-device reasons.
Same rules and same answers as `cohabit.placement`, none of the indexing."""

from __future__ import annotations

from collections import Counter

from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.placement.decision import Allocation, Decision, Placement
from cohabit.placement.filters import capacity_filter, static_reason
from cohabit.placement.reasons import FilterCode, NoFit, NoFitReason
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState


class ScanPlanner:
    def __init__(self, state: FleetState) -> None:
        self.slots = state.slots
        self.free = state.free_bytes()
        self.nodes = len(state.fleet.nodes)

    def place(self, request: PlacementRequest) -> Decision:
        need = request.vram_bytes
        fits = []
        reasons: Counter[str] = Counter()
        for slot in self.slots:
            reason = static_reason(request, slot) or capacity_filter(
                request, slot, self.free[slot.position]
            )
            if reason is None:
                fits.append(slot)
            else:
                reasons[reason.code] += 1
        chosen = None
        if request.tensor_parallel == 1:
            for cpu_tier in (False, True):
                tier = [s for s in fits if (s.hardware_class is HardwareClass.CPU) is cpu_tier]
                if tier:
                    chosen = [min(tier, key=lambda s: (self.free[s.position] - need, s.position))]
                    break
        else:
            groups: dict[tuple[int, Vendor], list] = {}
            for slot in fits:
                groups.setdefault((slot.node_order, slot.vendor), []).append(slot)
            best = None
            for (node_order, _), slots in groups.items():
                if len(slots) >= request.tensor_parallel:
                    slots.sort(key=lambda s: (self.free[s.position], s.position))
                    pick = slots[: request.tensor_parallel]
                    key = (sum(self.free[s.position] - need for s in pick), node_order)
                    if best is None or key < best[0]:
                        best = (key, pick)
            chosen = best[1] if best else None
        if not chosen:
            largest = max(self.slots, key=lambda s: self.free[s.position])
            return NoFit(
                name=request.name,
                reason=NoFitReason.INSUFFICIENT_CAPACITY,
                requested_bytes=need,
                tensor_parallel=request.tensor_parallel,
                largest_free_bytes=self.free[largest.position],
                largest_free_location=largest.location,
                nodes_considered=self.nodes,
                node_reasons={str(FilterCode.INSUFFICIENT_GPU_MEMORY): self.nodes},
                candidates_considered=len(self.slots),
                candidates_filtered=dict(reasons),
            )
        allocations = tuple(
            Allocation(slot=s, allocated_bytes=s.capacity_bytes if s.exclusive else need)
            for s in sorted(chosen, key=lambda s: s.position)
        )
        for allocation in allocations:
            self.free[allocation.slot.position] -= allocation.allocated_bytes
        return Placement(
            name=request.name,
            request=request,
            node=allocations[0].slot.node,
            allocations=allocations,
            notices=(),
        )
