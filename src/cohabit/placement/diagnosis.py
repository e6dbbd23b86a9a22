"""Turning "nothing fits" into a `NoFit`: the request-level reason in docs/placement.md's order,
per-node and per-device counts, and the largest free budget with its location.

What the static filters say about each node and slot is computed once per kind of request
and cached, so a no-fit costs a few lookups even on a fleet of thousands of GPUs.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from cohabit.hardware.model import NoticeCode
from cohabit.hardware.slots import Slot, SlotKind
from cohabit.placement.filters import accel_version_filter, class_filter, vendor_filter
from cohabit.placement.index import FreeIndex
from cohabit.placement.reasons import FilterCode, NoFit, NoFitReason
from cohabit.placement.request import PlacementRequest

RequestKind = tuple[frozenset[str], str | None, int]  # vendors, minimum version, TP


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticView:
    """What the static filters say for one kind of request (vendors, minimum version, TP)."""

    vendor_passing: int
    version_passing: int
    slot_filtered: Counter[str]
    node_verdicts: Counter[str]
    capacity_pool_nodes: int
    capacity_gpu_nodes: int
    # For nodes that only lack sharing: the largest whole GPU each could offer, sorted.
    unshared_capacities: tuple[int, ...]
    passing_groups: frozenset[int]
    passing_pools: int
    passing_devices: int


def request_kind(request: PlacementRequest) -> RequestKind:
    vendors = frozenset(v.value for v in request.eligible_vendors())
    return (vendors, request.min_accel_version, request.tensor_parallel)


class Diagnosis:
    """Builds `NoFit` values for one fleet, caching the static part per kind of request."""

    def __init__(
        self, slots: tuple[Slot, ...], node_count: int, foreign: Mapping[int, int] | None = None
    ) -> None:
        self._slots = slots
        # Bytes held outside cohabit per slot position, where they cut the free budget.
        self._foreign = dict(foreign or {})
        self._node_count = node_count
        self._by_node: list[list[Slot]] = [[] for _ in range(node_count)]
        for slot in slots:
            self._by_node[slot.node_order].append(slot)
        self._cache: dict[RequestKind, StaticView] = {}

    def no_fit(self, request: PlacementRequest, index: FreeIndex) -> NoFit:
        shards = request.tensor_parallel
        view = self._static(request, index)
        need = request.vram_bytes
        nodes = Counter(view.node_verdicts)
        sharing_nodes = 0
        if shards > 1:
            nodes[FilterCode.INSUFFICIENT_GPU_COUNT] += (
                view.capacity_gpu_nodes + view.capacity_pool_nodes
            )
        else:
            sharing_nodes = len(view.unshared_capacities) - bisect_left(
                view.unshared_capacities, need
            )
            if sharing_nodes:
                nodes[FilterCode.SHARING_NOT_CONFIGURED] += sharing_nodes
            nodes[FilterCode.INSUFFICIENT_GPU_MEMORY] += view.capacity_gpu_nodes - sharing_nodes
            nodes[FilterCode.INSUFFICIENT_SYSTEM_MEMORY] += view.capacity_pool_nodes
        slots_filtered = Counter(view.slot_filtered)
        taken = sum(index.taken_exclusive(g) for g in view.passing_groups)
        if taken:
            slots_filtered[FilterCode.DEVICE_TAKEN] += taken
        if view.passing_pools:
            slots_filtered[FilterCode.INSUFFICIENT_SYSTEM_MEMORY] += view.passing_pools
        short = view.passing_devices - view.passing_pools - taken
        if short:
            code = (
                FilterCode.INSUFFICIENT_GPU_COUNT
                if shards > 1
                else FilterCode.INSUFFICIENT_GPU_MEMORY
            )
            slots_filtered[code] += short
        largest_bytes, largest_at = 0, None
        for group_id in sorted(view.passing_groups):
            hit = index.largest(group_id)
            if hit is not None and (largest_at is None or hit[0] > largest_bytes):
                largest_bytes, largest_at = hit[0], self._slots[hit[1]].location
        foreign_bytes, foreign_at = self._largest_foreign(view, index)
        return NoFit(
            name=request.name,
            reason=_reason(request, view, sharing_nodes),
            requested_bytes=need,
            tensor_parallel=shards,
            largest_free_bytes=largest_bytes,
            largest_free_location=largest_at,
            nodes_considered=self._node_count,
            node_reasons={str(code): n for code, n in nodes.items() if n},
            candidates_considered=len(self._slots),
            candidates_filtered={str(code): n for code, n in slots_filtered.items() if n},
            foreign_bytes=foreign_bytes,
            foreign_location=foreign_at,
        )

    def _largest_foreign(self, view: StaticView, index: FreeIndex) -> tuple[int, str | None]:
        """The most memory held outside cohabit on a device this request could have used."""
        best_bytes, best_at = 0, None
        for position, held in sorted(self._foreign.items()):
            if index.group_of[position] in view.passing_groups and held > best_bytes:
                best_bytes, best_at = held, self._slots[position].location
        return best_bytes, best_at

    def _static(self, request: PlacementRequest, index: FreeIndex) -> StaticView:
        cache_key = request_kind(request)
        view = self._cache.get(cache_key)
        if view is None:
            view = self._build_static(request, index)
            self._cache[cache_key] = view
        return view

    def _build_static(self, request: PlacementRequest, index: FreeIndex) -> StaticView:
        slot_filtered: Counter[str] = Counter()
        node_verdicts: Counter[str] = Counter()
        vendor_passing = version_passing = 0
        pool_nodes = gpu_nodes = passing_pools = passing_devices = 0
        unshared: list[int] = []
        groups: set[int] = set()
        for node_slots in self._by_node:
            remaining = node_slots
            verdict: str | None = None
            for check in (vendor_filter, accel_version_filter, class_filter):
                kept: list[Slot] = []
                first_reason = None
                for slot in remaining:
                    reason = check(request, slot)
                    if reason is None:
                        kept.append(slot)
                    else:
                        slot_filtered[reason.code] += 1
                        first_reason = first_reason or reason
                if check is vendor_filter:
                    vendor_passing += len(kept)
                elif check is accel_version_filter:
                    version_passing += len(kept)
                remaining = kept
                if not kept:
                    verdict = str(first_reason.code) if first_reason else None
                    break
            if verdict is not None:
                node_verdicts[verdict] += 1
                continue
            if not remaining:
                continue
            gpu_like = [s for s in remaining if s.kind is SlotKind.GPU]
            if request.tensor_parallel > 1 and len(gpu_like) < request.tensor_parallel:
                node_verdicts[FilterCode.INSUFFICIENT_GPU_COUNT] += 1
            elif all(s.kind is SlotKind.POOL for s in remaining):
                pool_nodes += 1
            else:
                gpu_nodes += 1
                whole = [
                    s.capacity_bytes
                    for s in remaining
                    if s.exclusive and NoticeCode.SHARING_NOT_CONFIGURED in s.notices
                ]
                if whole:
                    unshared.append(max(whole))
            passing_pools += sum(1 for s in remaining if s.kind is SlotKind.POOL)
            passing_devices += len(remaining)
            groups.update(index.group_of[s.position] for s in remaining)
        return StaticView(
            vendor_passing=vendor_passing,
            version_passing=version_passing,
            slot_filtered=slot_filtered,
            node_verdicts=node_verdicts,
            capacity_pool_nodes=pool_nodes,
            capacity_gpu_nodes=gpu_nodes,
            unshared_capacities=tuple(sorted(unshared)),
            passing_groups=frozenset(groups),
            passing_pools=passing_pools,
            passing_devices=passing_devices,
        )


def _reason(request: PlacementRequest, view: StaticView, sharing_nodes: int) -> NoFitReason:
    """docs/placement.md precedence."""
    if view.vendor_passing == 0:
        return NoFitReason.VENDOR_MISMATCH
    if view.version_passing == 0:
        return NoFitReason.ACCEL_VERSION_UNMET
    if request.tensor_parallel > 1:
        return NoFitReason.INSUFFICIENT_GPU_COUNT
    if sharing_nodes:
        return NoFitReason.SHARING_NOT_CONFIGURED
    if view.passing_devices and view.passing_pools == view.passing_devices:
        return NoFitReason.INSUFFICIENT_SYSTEM_MEMORY
    return NoFitReason.INSUFFICIENT_CAPACITY
