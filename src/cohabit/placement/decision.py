"""The planner's decision: where a request landed (`Placement`, one `Allocation` per shard,
and the `Choice` that picked them) or why it could not (`NoFit`). Pure values, beside the
`Reservation`s a placement holds (`state.py`); `planner.py` makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cohabit.hardware.model import HardwareClass, NoticeCode, Topology, Vendor
from cohabit.hardware.slots import Slot, SlotKind
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy
from cohabit.placement.state import Reservation
from cohabit.units import format_gib, gib_ceil


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """Bytes reserved on one slot: the request, or the whole slot when it is exclusive."""

    slot: Slot
    allocated_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementFields:
    """A placement's public fields, under the names deployment records (the store's
    placement columns) and the API use."""

    topology: str
    node_name: str
    gpu_index: int | None
    gpu_indices: tuple[int, ...]
    partition: str | None
    gpu_vendor: str | None
    gpu_id: str | None
    hardware_class: str
    sharing_class: str
    allocated_bytes: int
    device_total_bytes: int
    notices: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """What the planner knew when it chose: its policy, the bytes the chosen slots keep free
    after the placement, and whether any accelerator could have run the request."""

    policy: Policy
    left_bytes: int
    accelerators_eligible: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where a request landed: one node, one slot per tensor-parallel shard."""

    name: str
    request: PlacementRequest
    node: str
    allocations: tuple[Allocation, ...]
    notices: tuple[NoticeCode, ...]
    # How the planner chose these slots (`why` says it in words); None for a placement
    # rebuilt from held reservations. Not part of what the placement is.
    choice: Choice | None = field(default=None, compare=False)

    placed = True

    @property
    def why(self) -> str:
        """The choice in words, as a deployment's timeline shows it ("" when unknown): the
        rule that picked these slots and what it leaves free, and why a CPU pool."""
        choice = self.choice
        if choice is None:
            return ""
        first = self.first
        if first.kind is SlotKind.PARTITION:
            need = format_gib(self.request.vram_bytes, digits=2)
            text = f"the smallest free partition that holds {need}, taken whole"
        elif first.exclusive:
            text = f"a GPU with nothing on it, taken whole ({first.sharing_class}: not shared)"
        else:
            capacity = sum(a.slot.capacity_bytes for a in self.allocations)
            rule = "the tightest fit" if choice.policy is Policy.BINPACK else "the most room"
            devices = f" of {len(self.allocations)} GPUs" if len(self.allocations) > 1 else ""
            left, whole = format_gib(choice.left_bytes, digits=2), format_gib(capacity, digits=2)
            text = f"{choice.policy.value}: {rule}{devices}, leaving {left} of {whole} free"
        if first.hardware_class is HardwareClass.CPU:
            if self.request.vendor is Vendor.CPU:
                text += "; the CPU was asked for"
            elif choice.accelerators_eligible:
                text += "; no accelerator had room, so the CPU pool takes it"
            else:
                text += "; no accelerator here can run it, so the CPU pool takes it"
        return text

    @property
    def first(self) -> Slot:
        return self.allocations[0].slot

    @property
    def gpu_indices(self) -> list[int]:
        """GPU indices on the node; empty for memory pools."""
        return [a.slot.gpu_index for a in self.allocations if a.slot.gpu_index is not None]

    @property
    def partition(self) -> str | None:
        """The partition profile (e.g. ``3g.20gb``) for a MIG or AMD partition placement."""
        return self.first.partition_profile

    @property
    def hardware_class(self) -> HardwareClass:
        return self.first.hardware_class

    @property
    def sharing_class(self) -> str:
        return self.first.sharing_class

    @property
    def gpu_vendor(self) -> Vendor:
        return self.first.vendor

    @property
    def allocated_bytes(self) -> int:
        """Budget per device (the largest, should exclusive devices of a TP set differ)."""
        allocations = self.allocations
        if len(allocations) == 1:
            return allocations[0].allocated_bytes
        return max([a.allocated_bytes for a in allocations])

    @property
    def allocated_capacity_gb(self) -> int:
        """`allocated_bytes` in whole GiB, rounded up (the public "GB" unit)."""
        return gib_ceil(self.allocated_bytes)

    def record_fields(self, topology: Topology) -> PlacementFields:
        """The one mapping from a placement to its public fields, as a deployment record
        keeps them (the store's placement columns, which the API shows as they are)."""
        first = self.first
        return PlacementFields(
            topology=topology.value,
            node_name=self.node,
            gpu_index=first.gpu_index,
            gpu_indices=tuple(self.gpu_indices),
            partition=self.partition,
            gpu_vendor=None if self.gpu_vendor is Vendor.CPU else self.gpu_vendor.value,
            gpu_id=first.gpu_uuid,
            hardware_class=self.hardware_class.value,
            sharing_class=self.sharing_class,
            allocated_bytes=self.allocated_bytes,
            device_total_bytes=first.total_bytes,
            notices=tuple(code.value for code in self.notices),
        )

    def fields(self) -> dict[str, object]:
        """The plan output's view (`cohabit plan`, the placement preview); deployment
        records use `record_fields`. `cohabit plan --json` asks it of every placement, so
        it reads each property once."""
        first = self.allocations[0].slot
        allocated = self.allocated_bytes
        return {
            "node": self.node,
            "gpu_indices": self.gpu_indices,
            "partition": first.partition_profile,
            "hardware_class": first.hardware_class.value,
            "sharing_class": first.sharing_class,
            "allocated_bytes": allocated,
            "allocated_capacity_gb": gib_ceil(allocated),
            "notices": [code.value for code in self.notices],
        }

    def reservations(self, deployment: str | None = None) -> tuple[Reservation, ...]:
        owner = deployment or self.name
        return tuple(
            Reservation(
                deployment=owner,
                node=a.slot.node,
                gpu_index=a.slot.gpu_index,
                partition_index=a.slot.partition_index,
                reserved_bytes=a.allocated_bytes,
            )
            for a in self.allocations
        )


Decision = Placement | NoFit
