"""Batch planning: given a whole set of requests, place as many as possible, then as many
bytes as possible — the capacity-planning question "what is the most this fleet can hold?".

Online order can strand space (one 16 GiB card, requests 10, 6, 6, 4 GiB: online binpack
places two; three fit). When every request may go on the same devices, the most requests
that fit are always the k smallest (swap any placed request for a smaller one and it still
fits), so the planner searches for the largest k whose k smallest requests pack — best-fit
decreasing first, an exact depth-first search on small instances when that fails. Otherwise
it grows the set smallest first, keeping a request when the set still packs. Then larger
requests replace smaller ones in place wherever they fit, raising the bytes placed. The result
is never worse than online order: both are computed and the better one returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cohabit.hardware.model import Vendor
from cohabit.placement.decision import Decision, Placement
from cohabit.placement.filters import static_reason
from cohabit.placement.planner import Planner, plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy
from cohabit.placement.state import FleetState

# Instances up to these sizes get the exact feasibility search.
EXACT_MAX_REQUESTS = 128
EXACT_MAX_SLOTS = 64
EXACT_STEP_BUDGET = 100_000

Assignment = dict[int, list[int]]  # request index → slot positions


def plan_batch(
    state: FleetState, requests: Iterable[PlacementRequest], *, policy: Policy = Policy.BINPACK
) -> list[Decision]:
    """Decisions in the order of `requests`, chosen to place the most requests, then bytes."""
    ordered = list(requests)
    online = plan_online(state, ordered, policy=policy)
    packer = _Packer(state, ordered)
    batch = packer.decisions(packer.best_set())
    return batch if _value(batch) > _value(online) else online


def _value(decisions: Sequence[Decision]) -> tuple[int, int]:
    placed = [d for d in decisions if isinstance(d, Placement)]
    return (len(placed), sum(p.request.total_bytes for p in placed))


class _OutOfSteps(Exception):
    """The exact search ran out of steps; the set is treated as not packing."""


class _Packer:
    def __init__(self, state: FleetState, requests: list[PlacementRequest]) -> None:
        self.state = state
        self.requests = requests
        self.slots = state.slots
        self.base_free = state.free_bytes()
        self.small = len(requests) <= EXACT_MAX_REQUESTS and len(self.slots) <= EXACT_MAX_SLOTS
        self._eligible: dict[tuple[frozenset[Vendor], str | None], list[int]] = {}
        self._memo: dict[frozenset[int], Assignment | None] = {}
        self.by_size = sorted(range(len(requests)), key=self._size_key)

    # -- choosing the set -------------------------------------------------------------------

    def best_set(self) -> list[int]:
        if self._uniform():
            return self.by_size[: self._most_smallest_that_pack()]
        chosen: list[int] = []
        for i in self.by_size:
            if self._pack([*chosen, i]) is not None:
                chosen.append(i)
        return chosen

    def _uniform(self) -> bool:
        """Every request single-device and allowed on exactly the same slots."""
        if any(r.tensor_parallel > 1 for r in self.requests):
            return False
        first = self._eligible_positions(0) if self.requests else []
        return all(self._eligible_positions(i) is first for i in range(len(self.requests)))

    def _most_smallest_that_pack(self) -> int:
        low, high = 0, len(self.by_size)
        while low < high:
            mid = (low + high + 1) // 2
            if self._pack(self.by_size[:mid]) is not None:
                low = mid
            else:
                high = mid - 1
        return low

    # -- turning the set into decisions ---------------------------------------------------------

    def decisions(self, chosen: list[int]) -> list[Decision]:
        assignment = self._upgrade(dict(self._pack(chosen) or {}))
        planner = Planner(self.state, policy=Policy.BINPACK)
        placed: dict[int, Decision] = {}
        for i in sorted(assignment, key=self._pack_key):
            placement = planner.place_on(self.requests[i], assignment[i])
            if placement is not None:
                placed[i] = placement
        # Whatever still fits in what is left (never the case when the search was exact).
        for i in self.by_size:
            if i not in placed:
                placed[i] = planner.place(self.requests[i])
        return [placed[i] for i in range(len(self.requests))]

    def _upgrade(self, assignment: Assignment) -> Assignment:
        """Raise the bytes placed at the same count: move a larger unplaced request into the
        slot of a smaller placed one whenever it fits there."""
        free = list(self.base_free)
        for i, positions in assignment.items():
            for position in positions:
                free[position] -= self._taken(i, position)
        for candidate in reversed(self.by_size):
            request = self.requests[candidate]
            if candidate in assignment or request.tensor_parallel > 1:
                continue
            allowed = set(self._eligible_positions(candidate))
            for victim in sorted(assignment, key=self._size_key):
                smaller = self.requests[victim]
                if smaller.total_bytes >= request.total_bytes:
                    break
                if smaller.tensor_parallel > 1 or assignment[victim][0] not in allowed:
                    continue
                position = assignment[victim][0]
                room = free[position] + self._taken(victim, position)
                slot = self.slots[position]
                fits = (
                    slot.capacity_bytes >= request.vram_bytes
                    if slot.exclusive
                    else (room >= request.vram_bytes)
                )
                if fits:
                    free[position] = room - self._taken(candidate, position)
                    del assignment[victim]
                    assignment[candidate] = [position]
                    break
        return assignment

    # -- packing a set ----------------------------------------------------------------------

    def _pack(self, indices: Sequence[int]) -> Assignment | None:
        """Slots for each request so that all of them fit at once, or None."""
        key = frozenset(indices)
        if key not in self._memo:
            result = self._best_fit_decreasing(indices)
            if result is None and self.small:
                result = self._exact(sorted(indices, key=self._pack_key))
            self._memo[key] = result
        return self._memo[key]

    def _best_fit_decreasing(self, indices: Sequence[int]) -> Assignment | None:
        planner = Planner(self.state, policy=Policy.BINPACK)
        packed: Assignment = {}
        for i in sorted(indices, key=self._pack_key):
            decision = planner.place(self.requests[i])
            if not isinstance(decision, Placement):
                return None
            packed[i] = [a.slot.position for a in decision.allocations]
        return packed

    def _exact(self, indices: list[int]) -> Assignment | None:
        """Exact search (bin completion) for sets of single-device requests.

        Exclusive slots first: each takes one request that fits, or stays empty. Then the
        shared slots, roomiest first, each filled with a subset of what is left that no other
        remaining request could be added to. Every byte a shared slot leaves unused is
        charged against the slack (room minus bytes to place); a branch ends when the slack
        runs out. Tight instances — the ones best-fit decreasing misses — have little slack,
        which is what makes this fast where searching request by request is not.
        """
        if any(self.requests[i].tensor_parallel > 1 for i in indices):
            return None
        return _BinCompletion(self, indices).run()

    # -- helpers ----------------------------------------------------------------------------

    def _taken(self, i: int, position: int) -> int:
        slot = self.slots[position]
        return slot.capacity_bytes if slot.exclusive else self.requests[i].vram_bytes

    def _size_key(self, i: int) -> tuple[int, int]:
        return (self.requests[i].total_bytes, i)

    def _pack_key(self, i: int) -> tuple[int, int, int]:
        request = self.requests[i]
        return (-request.tensor_parallel, -request.vram_bytes, i)

    def _eligible_positions(self, i: int) -> list[int]:
        """Slots whose static filters pass for request i (one shared list per kind)."""
        request = self.requests[i]
        cache_key = (request.eligible_vendors(), request.min_accel_version)
        positions = self._eligible.get(cache_key)
        if positions is None:
            positions = [s.position for s in self.slots if static_reason(request, s) is None]
            self._eligible[cache_key] = positions
        return positions


class _BinCompletion:
    """One exact search; see `_Packer._exact`."""

    def __init__(self, packer: _Packer, indices: list[int]) -> None:
        self.size = {i: packer.requests[i].vram_bytes for i in indices}
        self.items = sorted(indices, key=lambda i: (-self.size[i], i))
        eligible = {i: packer._eligible_positions(i) for i in indices}
        self.allowed = {i: frozenset(positions) for i, positions in eligible.items()}
        union = sorted({p for positions in eligible.values() for p in positions})
        self.free = packer.base_free
        slots = packer.slots
        self.exclusive = [
            p for p in union if slots[p].exclusive and self.free[p] == slots[p].capacity_bytes
        ]
        self.shared = sorted(
            (p for p in union if not slots[p].exclusive and self.free[p] > 0),
            key=lambda p: (-self.free[p], p),
        )
        self.steps = 0
        self.assignment: dict[int, int] = {}

    def run(self) -> Assignment | None:
        try:
            found = self._fill_exclusive(0, self.items)
        except _OutOfSteps:
            return None
        return {i: [p] for i, p in self.assignment.items()} if found else None

    def _step(self) -> None:
        self.steps += 1
        if self.steps > EXACT_STEP_BUDGET:
            raise _OutOfSteps

    def _fill_exclusive(self, e: int, remaining: list[int]) -> bool:
        if e == len(self.exclusive):
            slack = sum(self.free[p] for p in self.shared) - sum(self.size[i] for i in remaining)
            return slack >= 0 and self._fill_shared(0, remaining, slack)
        position = self.exclusive[e]
        tried: set[tuple[int, frozenset[int]]] = set()
        for i in remaining:
            kind = (self.size[i], self.allowed[i])
            if position not in self.allowed[i] or self.size[i] > self.free[position]:
                continue
            if kind in tried:
                continue
            tried.add(kind)
            self._step()
            self.assignment[i] = position
            if self._fill_exclusive(e + 1, [x for x in remaining if x != i]):
                return True
            del self.assignment[i]
        return self._fill_exclusive(e + 1, remaining)

    def _fill_shared(self, b: int, remaining: list[int], slack: int) -> bool:
        if not remaining:
            return True
        if b == len(self.shared):
            return False
        position = self.shared[b]
        room = self.free[position]
        candidates = [i for i in remaining if position in self.allowed[i] and self.size[i] <= room]
        chosen: list[int] = []

        def choose(j: int, left: int) -> bool:
            self._step()
            if j == len(candidates):
                if left > slack or any(self.size[i] <= left for i in candidates if i not in chosen):
                    return False  # wastes too much, or another request would still fit
                taken = set(chosen)
                for i in chosen:
                    self.assignment[i] = position
                rest = [i for i in remaining if i not in taken]
                if self._fill_shared(b + 1, rest, slack - left):
                    return True
                for i in chosen:
                    del self.assignment[i]
                return False
            i = candidates[j]
            if self.size[i] <= left:
                chosen.append(i)
                if choose(j + 1, left - self.size[i]):
                    return True
                chosen.pop()
            # Leaving i out: leave out its identical twins too (taking a twin instead of i
            # would only repeat this branch).
            k = j + 1
            while k < len(candidates) and (
                self.size[candidates[k]] == self.size[i]
                and self.allowed[candidates[k]] == self.allowed[i]
            ):
                k += 1
            return choose(k, left)

        return choose(0, room)
