"""FreeIndex: the planner's working view of free budget, indexed so that one decision looks at
a handful of sorted lists instead of every device of the fleet.

Slots that every static filter treats alike (same vendor, accelerator version, kind, class,
schedulability) form a group; each group keeps its slots sorted by (free bytes, position), so
best fit is one bisection and the largest free budget is the last entry. Tensor-parallel
requests read each node's sorted free GPU budgets, and spread a second index: for each k,
nodes sorted by the k-th largest free GPU budget.

The sorted lists are plain lists kept in order with `bisect`: a lookup is one C bisection,
and a change moves the entries after it in memory, which stays below a few microseconds up to
tens of thousands of alike devices — cheaper than a balanced structure's Python-level steps at
any fleet size placement meets.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.hardware.slots import Slot, SlotKind

GroupKey = tuple[Vendor, str | None, SlotKind, HardwareClass, bool]
Entry = tuple[int, int]  # (free bytes, slot position)


@dataclass(slots=True)
class Group:
    """Alike slots and their free budgets, sorted."""

    key: GroupKey
    representative: Slot
    entries: list[Entry]
    size: int


def group_key(slot: Slot) -> GroupKey:
    return (slot.vendor, slot.accel_version, slot.kind, slot.hardware_class, slot.schedulable)


class FreeIndex:
    """Free bytes per slot, kept sorted per group and per node for tensor parallelism."""

    def __init__(self, slots: tuple[Slot, ...], free: list[int], node_count: int) -> None:
        self.slots = slots
        self.free = list(free)
        self.groups: list[Group] = []
        self.group_of: list[int] = []
        ids: dict[GroupKey, int] = {}
        for slot in slots:
            key = group_key(slot)
            if key not in ids:
                ids[key] = len(self.groups)
                self.groups.append(Group(key=key, representative=slot, entries=[], size=0))
            group = self.groups[ids[key]]
            group.size += 1
            group.entries.append((self.free[slot.position], slot.position))
            self.group_of.append(ids[key])
        for group in self.groups:
            group.entries.sort()
        self.node_gpus: list[list[int]] = [[] for _ in range(node_count)]
        for slot in slots:
            if slot.kind is SlotKind.GPU:
                self.node_gpus[slot.node_order].append(slot.position)
        # A node is "uniform" when its GPUs share one group (vendor, version, class): the
        # planner can then score it from sorted free values alone.
        self.node_groups: list[frozenset[int]] = [
            frozenset(self.group_of[p] for p in positions) for positions in self.node_gpus
        ]
        self.node_uniform: list[bool] = [len(groups) == 1 for groups in self.node_groups]
        # Each node's free GPU budgets sorted, computed when first asked (None: not yet, or
        # changed since); and the index by k-th largest budget, built when spread first
        # places a tensor-parallel request (binpack never reads it). A decision that is not
        # tensor-parallel then sorts nothing.
        self._node_ascending: list[list[int] | None] = [None] * node_count
        self._tp: dict[int, list[tuple[int, int]]] | None = None

    def best_fit(self, group_id: int, need_bytes: int) -> Entry | None:
        """The slot with the least free budget that still holds `need_bytes` (lowest position
        among equals)."""
        entries = self.groups[group_id].entries
        at = bisect_left(entries, (need_bytes, -1))
        return entries[at] if at < len(entries) else None

    def tightest(self, group_ids: Iterable[int], need_bytes: int) -> Entry | None:
        """The least free budget that holds `need_bytes` over these groups (lowest position
        among equals): binpack's choice among them."""
        key = (need_bytes, -1)
        groups = self.groups
        best: Entry | None = None
        for group_id in group_ids:
            entries = groups[group_id].entries
            at = bisect_left(entries, key)
            if at < len(entries) and (best is None or entries[at] < best):
                best = entries[at]
        return best

    def largest(self, group_id: int) -> Entry | None:
        """The slot with the most free budget (lowest position among equals)."""
        entries = self.groups[group_id].entries
        if not entries:
            return None
        return entries[bisect_left(entries, (entries[-1][0], -1))]

    def fits_ascending(self, group_id: int, need_bytes: int) -> Iterator[Entry]:
        """The group's slots that hold `need_bytes`, tightest first."""
        entries = self.groups[group_id].entries
        # Lazily from the first fit on (islice would step over every entry before it).
        return map(entries.__getitem__, range(bisect_left(entries, (need_bytes, -1)), len(entries)))

    def taken_exclusive(self, group_id: int) -> int:
        """How many exclusive slots of the group hold a deployment (their free is zero)."""
        group = self.groups[group_id]
        if not group.representative.exclusive:
            return 0
        return bisect_left(group.entries, (1, -1))

    def set_free(self, position: int, free_bytes: int) -> None:
        old = self.free[position]
        if old == free_bytes:
            return
        entries = self.groups[self.group_of[position]].entries
        del entries[bisect_left(entries, (old, position))]
        insort(entries, (free_bytes, position))
        self.free[position] = free_bytes
        slot = self.slots[position]
        if slot.kind is SlotKind.GPU:
            if self._tp is None:
                self._node_ascending[slot.node_order] = None
            else:
                self._refresh_node(self._tp, slot.node_order)

    def tp_candidate_nodes(self, shards: int, need_bytes: int) -> list[int]:
        """Nodes (by order) whose `shards`-th largest free GPU budget holds `need_bytes` —
        a superset of the nodes that can take the request, in node order."""
        if self._tp is None:
            self._tp = self._build_tp()
        index = self._tp.get(shards)
        if index is None:
            return []
        return sorted(node for _, node in index[bisect_left(index, (need_bytes, -1)) :])

    def kth_largest_free(self, node_order: int, k: int) -> int:
        """The k-th largest free GPU budget on the node, or -1 when it has fewer GPUs."""
        values = self.node_free_ascending(node_order)
        return values[-k] if len(values) >= k else -1

    def node_free_ascending(self, node_order: int) -> list[int]:
        """Free budgets of the node's GPUs, smallest first."""
        values = self._node_ascending[node_order]
        if values is None:
            values = self._node_ascending[node_order] = self._sorted_free(node_order)
        return values

    def _sorted_free(self, node_order: int) -> list[int]:
        return sorted([self.free[pos] for pos in self.node_gpus[node_order]])

    def _build_tp(self) -> dict[int, list[tuple[int, int]]]:
        """For each k from 2, the nodes by their k-th largest free GPU budget; from here on
        every node's sorted budgets are kept current, which `_refresh_node` reads."""
        ascending = [self.node_free_ascending(n) for n in range(len(self.node_gpus))]
        most = max((len(values) for values in ascending), default=0)
        tp: dict[int, list[tuple[int, int]]] = {k: [] for k in range(2, most + 1)}
        for node_order, values in enumerate(ascending):
            for k in range(2, len(values) + 1):
                tp[k].append((values[-k], node_order))
        for entries in tp.values():
            entries.sort()
        return tp

    def _refresh_node(self, tp: dict[int, list[tuple[int, int]]], node_order: int) -> None:
        old = self.node_free_ascending(node_order)
        new = self._sorted_free(node_order)
        for k in range(2, len(new) + 1):
            if old[-k] != new[-k]:
                entries = tp[k]
                del entries[bisect_left(entries, (old[-k], node_order))]
                insort(entries, (new[-k], node_order))
        self._node_ascending[node_order] = new
