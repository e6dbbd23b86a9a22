"""FleetState: the fleet plus the reservations already made on it — the immutable snapshot
the planner decides against. The control plane builds one from its store; plans return new
states through `with_placement()` rather than changing this one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from cohabit.hardware.model import Fleet
from cohabit.hardware.slots import Slot, SlotKey, slots_of

if TYPE_CHECKING:
    from cohabit.placement.planner import Placement


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """Bytes one deployment holds on one slot (node, GPU index, partition index)."""

    deployment: str
    node: str
    gpu_index: int | None
    partition_index: int | None
    reserved_bytes: int

    @property
    def slot_key(self) -> SlotKey:
        return (self.node, self.gpu_index, self.partition_index)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetState:
    """A fleet and its reservations. Reservations on slots the fleet no longer has are kept
    (they still belong to deployments) but count against nothing."""

    fleet: Fleet
    reservations: tuple[Reservation, ...] = ()
    slots: tuple[Slot, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", slots_of(self.fleet))

    def used_bytes(self) -> Mapping[SlotKey, int]:
        """Reserved bytes per slot key."""
        used: dict[SlotKey, int] = {}
        for reservation in self.reservations:
            used[reservation.slot_key] = (
                used.get(reservation.slot_key, 0) + reservation.reserved_bytes
            )
        return MappingProxyType(used)

    def free_bytes(self) -> list[int]:
        """Free budget per slot, by `Slot.position` (`free_budget` of what each holds)."""
        used = self.used_bytes()
        return [free_budget(slot, used.get(slot.key, 0)) for slot in self.slots]

    def with_placement(self, placement: Placement) -> FleetState:
        """A new state in which `placement` holds its budgets."""
        return self.with_reservations(placement.reservations())

    def with_reservations(self, reservations: Iterable[Reservation]) -> FleetState:
        return FleetState(fleet=self.fleet, reservations=(*self.reservations, *reservations))

    def without(self, deployment: str) -> FleetState:
        """A new state in which `deployment` holds nothing."""
        kept = tuple(r for r in self.reservations if r.deployment != deployment)
        return FleetState(fleet=self.fleet, reservations=kept)


def free_budget(slot: Slot, held_bytes: int) -> int:
    """What a slot holding `held_bytes` has free: an exclusive slot holding anything is full;
    an over-reserved slot (its capacity shrank) has zero free, never less."""
    if slot.exclusive and held_bytes:
        return 0
    return max(0, slot.capacity_bytes - held_bytes)
