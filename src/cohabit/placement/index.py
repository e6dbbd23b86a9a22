"""FreeIndex: the planner's working view of free budget, indexed so that one decision looks at
a handful of sorted lists instead of every device of the fleet.

Slots that every static filter treats alike (same vendor, accelerator version, kind, class,
schedulability) form a group; each group keeps its slots sorted by (free bytes, position), so
best fit is one bisection and the largest free budget is the last entry. Tensor-parallel
requests use a second index: for each k, nodes sorted by the k-th largest free GPU budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from sortedcontainers import SortedList

from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.hardware.slots import Slot, SlotKind

GroupKey = tuple[Vendor, str | None, SlotKind, HardwareClass, bool]
Entry = tuple[int, int]  # (free bytes, slot position)


@dataclass(slots=True)
class Group:
    """Alike slots and their free budgets, sorted."""

    key: GroupKey
    representative: Slot
    entries: SortedList
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
                self.groups.append(
                    Group(key=key, representative=slot, entries=SortedList(), size=0)
                )
            group = self.groups[ids[key]]
            group.size += 1
            self.group_of.append(ids[key])
        buckets: list[list[Entry]] = [[] for _ in self.groups]
        for position, group_id in enumerate(self.group_of):
            buckets[group_id].append((self.free[position], position))
        for group, bucket in zip(self.groups, buckets, strict=True):
            group.entries = SortedList(bucket)
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
        most = max((len(positions) for positions in self.node_gpus), default=0)
        self._node_ascending: list[list[int]] = [self._sorted_free(n) for n in range(node_count)]
        tp: dict[int, list[tuple[int, int]]] = {k: [] for k in range(2, most + 1)}
        for node_order, values in enumerate(self._node_ascending):
            for k in range(2, len(values) + 1):
                tp[k].append((values[-k], node_order))
        self._tp: dict[int, SortedList] = {k: SortedList(entries) for k, entries in tp.items()}

    def best_fit(self, group_id: int, need_bytes: int) -> Entry | None:
        """The slot with the least free budget that still holds `need_bytes` (lowest position
        among equals)."""
        entries = self.groups[group_id].entries
        at = entries.bisect_left((need_bytes, -1))
        return entries[at] if at < len(entries) else None

    def largest(self, group_id: int) -> Entry | None:
        """The slot with the most free budget (lowest position among equals)."""
        entries = self.groups[group_id].entries
        if not entries:
            return None
        at = entries.bisect_left((entries[-1][0], -1))
        return entries[at]  # type: ignore[no-any-return]

    def taken_exclusive(self, group_id: int) -> int:
        """How many exclusive slots of the group hold a deployment (their free is zero)."""
        group = self.groups[group_id]
        if not group.representative.exclusive:
            return 0
        return group.entries.bisect_left((1, -1))  # type: ignore[no-any-return]

    def set_free(self, position: int, free_bytes: int) -> None:
        old = self.free[position]
        if old == free_bytes:
            return
        entries = self.groups[self.group_of[position]].entries
        entries.remove((old, position))
        entries.add((free_bytes, position))
        self.free[position] = free_bytes
        slot = self.slots[position]
        if slot.kind is SlotKind.GPU and self._tp:
            self._refresh_node(slot.node_order)

    def tp_candidate_nodes(self, shards: int, need_bytes: int) -> list[int]:
        """Nodes (by order) whose `shards`-th largest free GPU budget holds `need_bytes` —
        a superset of the nodes that can take the request, in node order."""
        index = self._tp.get(shards)
        if index is None:
            return []
        return sorted(node for _, node in index.irange((need_bytes, -1)))

    def kth_largest_free(self, node_order: int, k: int) -> int:
        """The k-th largest free GPU budget on the node, or -1 when it has fewer GPUs."""
        values = self._node_ascending[node_order]
        return values[-k] if len(values) >= k else -1

    def node_free_ascending(self, node_order: int) -> list[int]:
        """Free budgets of the node's GPUs, smallest first."""
        return self._node_ascending[node_order]

    def _sorted_free(self, node_order: int) -> list[int]:
        return sorted(self.free[pos] for pos in self.node_gpus[node_order])

    def _refresh_node(self, node_order: int) -> None:
        old = self._node_ascending[node_order]
        new = self._sorted_free(node_order)
        for k in range(2, len(new) + 1):
            if old[-k] != new[-k]:
                self._tp[k].remove((old[-k], node_order))
                self._tp[k].add((new[-k], node_order))
        self._node_ascending[node_order] = new
