"""Batch planning: given a whole set of requests, place as many as possible, then as many
bytes as possible — the capacity-planning question "what is the most this fleet can hold?".

Online order can strand space (one 16 GiB card, requests 10, 6, 6, 4 GiB: online binpack
places two; three fit). The batch planner grows a set of requests smallest first and keeps a
request only if the whole set still packs; packing is best-fit decreasing, backed on small
instances by an exact search, then larger requests are swapped in while the count holds.
The result is never worse than online order: both are computed and the better one returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cohabit.hardware.model import Vendor
from cohabit.placement.filters import static_reason
from cohabit.placement.index import GroupKey, group_key
from cohabit.placement.ledger import FleetState
from cohabit.placement.planner import Decision, Placement, Planner, plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy

# Instances up to these sizes get the exact feasibility search and the swap pass.
EXACT_MAX_REQUESTS = 96
EXACT_MAX_SLOTS = 64
EXACT_NODE_BUDGET = 20_000


def plan_batch(
    state: FleetState, requests: Iterable[PlacementRequest], *, policy: Policy = Policy.BINPACK
) -> list[Decision]:
    """Decisions in the order of `requests`, chosen to place the most requests, then bytes."""
    ordered = list(requests)
    online = plan_online(state, ordered, policy=policy)
    packer = _Packer(state, ordered)
    chosen = packer.best_set()
    batch = packer.decisions(chosen)
    return batch if _value(batch) > _value(online) else online


def _value(decisions: Sequence[Decision]) -> tuple[int, int]:
    placed = [d for d in decisions if isinstance(d, Placement)]
    return (len(placed), sum(p.request.total_bytes for p in placed))


class _Budget(Exception):
    """The exact search ran out of steps; the set is treated as not packing."""


class _Packer:
    def __init__(self, state: FleetState, requests: list[PlacementRequest]) -> None:
        self.state = state
        self.requests = requests
        self.slots = state.slots
        self.base_free = state.free_bytes()
        self.small = len(requests) <= EXACT_MAX_REQUESTS and len(self.slots) <= EXACT_MAX_SLOTS
        self._eligible: dict[tuple[frozenset[Vendor], str | None], list[int]] = {}
        self._memo: dict[frozenset[int], dict[int, list[int]] | None] = {}

    def best_set(self) -> list[int]:
        by_size = sorted(range(len(self.requests)), key=self._size_key)
        if self.small:
            chosen: list[int] = []
            for i in by_size:
                if self._pack([*chosen, i]) is not None:
                    chosen.append(i)
            return self._swap_larger(chosen, by_size)
        # Large instances: the most smallest-first requests that pack (binary search), then
        # every other request that still fits into what is left.
        low, high = 0, len(by_size)
        while low < high:
            mid = (low + high + 1) // 2
            if self._pack(by_size[:mid]) is not None:
                low = mid
            else:
                high = mid - 1
        return by_size[:low]

    def decisions(self, chosen: list[int]) -> list[Decision]:
        assignment = self._pack(chosen) or {}
        planner = Planner(self.state, policy=Policy.BINPACK)
        placed: dict[int, Decision] = {}
        for i in sorted(assignment, key=self._pack_key):
            placement = planner.place_on(self.requests[i], assignment[i])
            if placement is not None:
                placed[i] = placement
        for i in sorted(range(len(self.requests)), key=self._size_key):
            if i not in placed:
                placed[i] = planner.place(self.requests[i])
        return [placed[i] for i in range(len(self.requests))]

    def _size_key(self, i: int) -> tuple[int, int]:
        return (self.requests[i].total_bytes, i)

    def _pack_key(self, i: int) -> tuple[int, int, int]:
        request = self.requests[i]
        return (-request.tensor_parallel, -request.vram_bytes, i)

    def _swap_larger(self, chosen: list[int], by_size: list[int]) -> list[int]:
        """Keep the count, raise the bytes: replace a placed request by a larger unplaced one
        whenever the set still packs."""
        current = list(chosen)
        for candidate in reversed(by_size):
            if candidate in current:
                continue
            size = self.requests[candidate].total_bytes
            for victim in sorted(current, key=self._size_key):
                if self.requests[victim].total_bytes >= size:
                    break
                trial = [i for i in current if i != victim] + [candidate]
                if self._pack(trial) is not None:
                    current = trial
                    break
        return current

    def _pack(self, indices: Sequence[int]) -> dict[int, list[int]] | None:
        """Slots for each request so that all of them fit at once, or None."""
        key = frozenset(indices)
        if key in self._memo:
            return self._memo[key]
        planner = Planner(self.state, policy=Policy.BINPACK)
        packed: dict[int, list[int]] = {}
        for i in sorted(indices, key=self._pack_key):
            decision = planner.place(self.requests[i])
            if not isinstance(decision, Placement):
                break
            packed[i] = [a.slot.position for a in decision.allocations]
        result: dict[int, list[int]] | None = packed
        if len(packed) < len(indices):
            result = self._exact(sorted(indices, key=self._pack_key)) if self.small else None
        self._memo[key] = result
        return result

    def _exact(self, indices: list[int]) -> dict[int, list[int]] | None:
        """Depth-first search over slot choices, largest request first, for sets of
        single-device requests; identical requests and alike slots are tried once."""
        if any(self.requests[i].tensor_parallel > 1 for i in indices):
            return None
        free = list(self.base_free)
        eligible = [self._eligible_positions(i) for i in indices]
        sizes = [self.requests[i].vram_bytes for i in indices]
        assignment: list[int] = [-1] * len(indices)
        steps = 0

        def search(k: int) -> bool:
            nonlocal steps
            if k == len(indices):
                return True
            steps += 1
            if steps > EXACT_NODE_BUDGET:
                raise _Budget
            need = sizes[k]
            same_as_previous = k > 0 and sizes[k - 1] == need and eligible[k - 1] is eligible[k]
            tried: set[tuple[GroupKey, int, int]] = set()
            for position in eligible[k]:
                if same_as_previous and position < assignment[k - 1]:
                    continue
                slot = self.slots[position]
                if free[position] < need or (
                    slot.exclusive and free[position] < slot.capacity_bytes
                ):
                    continue
                signature = (group_key(slot), slot.capacity_bytes, free[position])
                if signature in tried:
                    continue
                tried.add(signature)
                taken = slot.capacity_bytes if slot.exclusive else need
                free[position] -= taken
                assignment[k] = position
                if search(k + 1):
                    return True
                free[position] += taken
            return False

        try:
            found = search(0)
        except _Budget:
            return None
        if not found:
            return None
        return {i: [assignment[k]] for k, i in enumerate(indices)}

    def _eligible_positions(self, i: int) -> list[int]:
        request = self.requests[i]
        cache_key = (request.eligible_vendors(), request.min_accel_version)
        positions = self._eligible.get(cache_key)
        if positions is None:
            positions = [s.position for s in self.slots if static_reason(request, s) is None]
            self._eligible[cache_key] = positions
        return positions
