"""Slots: the places that hold budgets — a discrete GPU, one hardware partition, or a node's
memory pool — with their classes and the capacity placement may use.

`slots_of(fleet)` is the one derivation the planner, `cohabit gpus` and the node agent share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from cohabit.hardware import classify
from cohabit.hardware.model import Fleet, HardwareClass, Node, NoticeCode, Vendor

SlotKey = tuple[str, int | None, int | None]
"""`Slot.key`: (node, GPU index, partition index); reservations are keyed so."""


class SlotKind(StrEnum):
    GPU = "gpu"
    PARTITION = "partition"
    POOL = "pool"


@dataclass(frozen=True, slots=True, kw_only=True)
class Slot:
    """One budget holder.

    `position` orders slots as ties are broken: node order in the fleet, then GPU index, then
    partition order. `capacity_bytes` is what placement may reserve (a pool's total minus the
    OS reserve). `exclusive` slots (partitions, whole-GPU mode) hold one deployment, which is
    allocated the whole capacity.

    `gpu_uuid` names the card (a partition without its own UUID shows its card's);
    `device_uuid` is what an engine is pointed at: the GPU's UUID, a partition's own UUID
    (never its card's), None for pools or where unknown. `pci_bus_id` is the card's address.
    """

    position: int
    node: str
    node_order: int
    kind: SlotKind
    gpu_index: int | None
    partition_index: int | None
    partition_profile: str | None
    vendor: Vendor
    product: str
    accel_version: str | None
    gpu_uuid: str | None
    device_uuid: str | None
    pci_bus_id: str | None
    hardware_class: HardwareClass
    sharing_class: str
    total_bytes: int
    capacity_bytes: int
    exclusive: bool
    schedulable: bool
    unschedulable_reason: str | None
    notices: tuple[NoticeCode, ...]

    @property
    def key(self) -> SlotKey:
        """Stable identity: (node, GPU index, partition index); pools have (node, None, None)."""
        return (self.node, self.gpu_index, self.partition_index)

    @property
    def location(self) -> str:
        """Where this is, as messages say it: "node-a gpu 0", "node-a gpu 1 mig 3g.20gb"."""
        if self.kind is SlotKind.POOL:
            pool = "cpu" if self.hardware_class is HardwareClass.CPU else "unified"
            return f"{self.node} {pool} pool"
        text = f"{self.node} gpu {self.gpu_index}"
        if self.kind is SlotKind.PARTITION:
            label = "mig" if self.vendor is Vendor.NVIDIA else "partition"
            text += f" {label} {self.partition_profile} #{self.partition_index}"
        return text


def slots_of(fleet: Fleet) -> tuple[Slot, ...]:
    """Every slot of the fleet, in tie-break order. The last fleet's slots are kept: a fleet
    of the very same node objects (the operator's view of an unchanged cluster, decision
    after decision) has the same slots."""
    last = _last_slots
    if last is not None and _same_nodes(last[0], fleet):
        return last[1]
    slots: list[Slot] = []
    for node_order, node in enumerate(fleet.nodes):
        slots.extend(_node_slots(fleet, node, node_order, len(slots)))
    found = tuple(slots)
    _remember(fleet, found)
    return found


_last_slots: tuple[Fleet, tuple[Slot, ...]] | None = None


def _remember(fleet: Fleet, slots: tuple[Slot, ...]) -> None:
    global _last_slots
    _last_slots = (fleet, slots)


def _same_nodes(before: Fleet, fleet: Fleet) -> bool:
    """The same settings and the very same node objects, in the same order (nodes are
    frozen, so the same object is the same node)."""
    return (
        (before.topology, before.fractional, before.sharing_configured)
        == (fleet.topology, fleet.fractional, fleet.sharing_configured)
        and len(before.nodes) == len(fleet.nodes)
        and all(a is b for a, b in zip(before.nodes, fleet.nodes, strict=True))
    )


def _node_slots(fleet: Fleet, node: Node, node_order: int, start: int) -> list[Slot]:
    node_notices = tuple(notice.code for notice in node.notices)
    if node.is_unified or node.is_cpu_only:
        return [_pool_slot(fleet, node, node_order, start, node_notices)]
    slots: list[Slot] = []
    sharing_class = classify.discrete_sharing_class(fleet, node)
    whole_notices = node_notices
    if sharing_class == classify.WHOLE_GPU and not classify.sharing_configured(fleet, node):
        whole_notices = (*node_notices, NoticeCode.SHARING_NOT_CONFIGURED)
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        base = Slot(
            position=start + len(slots),
            node=node.name,
            node_order=node_order,
            kind=SlotKind.GPU,
            gpu_index=gpu.index,
            partition_index=None,
            partition_profile=None,
            vendor=gpu.vendor,
            product=gpu.product,
            accel_version=gpu.accel_version,
            gpu_uuid=gpu.uuid,
            device_uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            hardware_class=HardwareClass.SOFTWARE_SHARED,
            sharing_class=sharing_class,
            total_bytes=gpu.memory_bytes or 0,
            capacity_bytes=gpu.memory_bytes or 0,
            exclusive=sharing_class == classify.WHOLE_GPU,
            schedulable=node.schedulable,
            unschedulable_reason=node.unschedulable_reason,
            notices=whole_notices,
        )
        if not gpu.partitions:
            slots.append(base)
            continue
        for part_index, part in enumerate(gpu.partitions):
            slots.append(
                replace(
                    base,
                    position=start + len(slots),
                    kind=SlotKind.PARTITION,
                    partition_index=part_index,
                    partition_profile=part.profile,
                    gpu_uuid=part.uuid or gpu.uuid,
                    device_uuid=part.uuid,
                    hardware_class=HardwareClass.HARDWARE_ISOLATED,
                    sharing_class=classify.partition_sharing_class(gpu.vendor, part.profile),
                    total_bytes=part.memory_bytes,
                    capacity_bytes=part.memory_bytes,
                    exclusive=True,
                    notices=node_notices,
                )
            )
    return slots


def _pool_slot(
    fleet: Fleet, node: Node, node_order: int, position: int, notices: tuple[NoticeCode, ...]
) -> Slot:
    """A unified-memory pool (its GPU draws from it) or a CPU host's system memory, minus the
    OS reserve."""
    total = (node.unified_memory_bytes if node.is_unified else node.memory_bytes) or 0
    hardware_class, sharing_class = classify.pool_classes(node)
    first = node.gpus[0] if node.gpus else None
    return Slot(
        position=position,
        node=node.name,
        node_order=node_order,
        kind=SlotKind.POOL,
        gpu_index=None,
        partition_index=None,
        partition_profile=None,
        vendor=first.vendor if first else Vendor.CPU,
        product=first.product if first else "CPU",
        accel_version=first.accel_version if first else None,
        gpu_uuid=first.uuid if first else None,
        device_uuid=None,
        pci_bus_id=None,
        hardware_class=hardware_class,
        sharing_class=sharing_class,
        total_bytes=total,
        capacity_bytes=max(0, total - node.os_reserve_bytes),
        # Fractional placement off means whole-GPU everywhere, unified GPUs included; a CPU
        # pool is not a GPU and stays shared.
        exclusive=first is not None and not fleet.fractional,
        schedulable=node.schedulable,
        unschedulable_reason=node.unschedulable_reason,
        notices=notices,
    )
