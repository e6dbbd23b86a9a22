"""FleetState: the fleet plus the reservations already made on it — the immutable snapshot
the planner decides against. The control plane builds one from its store; plans return new
states through `with_reservations()` rather than changing this one.

A `Measurement` (what the meter last read on each device, or a recorded snapshot) may come
with it: the free budget then never counts on memory that processes outside cohabit hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from cohabit.hardware.model import Fleet
from cohabit.hardware.slots import Slot, SlotKey, slots_of

if TYPE_CHECKING:
    from cohabit.hardware.usage import DeviceUsage


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """Bytes one deployment holds on one slot (node, GPU index, partition index).

    A sleeping engine's reservation holds only its residue (`reserved_bytes`); `budget_bytes`
    is then the full budget a wake must take back, and `host_bytes` what sleep level 1 keeps
    in the node's host memory (placement/residency.py). Awake: None and 0.
    """

    deployment: str
    node: str
    gpu_index: int | None
    partition_index: int | None
    reserved_bytes: int
    budget_bytes: int | None = None
    host_bytes: int = 0

    @property
    def asleep(self) -> bool:
        return self.budget_bytes is not None

    @property
    def slot_key(self) -> SlotKey:
        return (self.node, self.gpu_index, self.partition_index)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredSlot:
    """What was measured on one slot's device: `free_bytes` the device reports free (a pool:
    the memory new processes can get), `cohabit_bytes` what cohabit's engines there use, and
    `foreign_bytes` the rest of the used memory (other processes; on a pool also the OS)."""

    free_bytes: int
    cohabit_bytes: int = 0
    foreign_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Measured figures per slot key, and the headroom kept free beside them.

    A slot's free budget becomes min(capacity − reserved, measured free − reserved but not yet
    used − headroom): memory an engine has been given but has not touched yet is not free,
    and what others hold is not either. An exclusive slot (a MIG slice, a whole GPU) is
    offered whole only while what others hold there stays within the headroom.
    """

    slots: Mapping[SlotKey, MeasuredSlot] = field(default_factory=dict)
    headroom_bytes: int = 0

    @classmethod
    def of(
        cls,
        devices: Iterable[DeviceUsage],
        cohabit_bytes: Mapping[SlotKey, int],
        *,
        headroom_bytes: int = 0,
    ) -> Measurement:
        """From measured devices and what cohabit's engines use on each: the rest of the
        used memory is foreign."""
        slots: dict[SlotKey, MeasuredSlot] = {}
        for device in devices:
            ours = cohabit_bytes.get(device.key, 0)
            slots[device.key] = MeasuredSlot(
                free_bytes=device.free_bytes,
                cohabit_bytes=ours,
                foreign_bytes=max(0, device.used_bytes - ours),
            )
        return cls(slots=slots, headroom_bytes=headroom_bytes)

    def limit(self, slot: Slot, held_bytes: int) -> int | None:
        """The measured bound on `slot`'s free budget; None when nothing was measured there."""
        measured = self.slots.get(slot.key)
        if measured is None:
            return None
        if slot.exclusive and not held_bytes and measured.foreign_bytes <= self.headroom_bytes:
            return slot.capacity_bytes
        untouched = max(0, held_bytes - measured.cohabit_bytes)
        return measured.free_bytes - untouched - self.headroom_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetState:
    """A fleet and its reservations. Reservations on slots the fleet no longer has are kept
    (they still belong to deployments) but count against nothing. `measurement`, when given,
    bounds each measured slot's free budget (see `Measurement`)."""

    fleet: Fleet
    reservations: tuple[Reservation, ...] = ()
    measurement: Measurement | None = None
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
        free: list[int] = []
        for slot in self.slots:
            held = used.get(slot.key, 0)
            budget = free_budget(slot, held)
            limit = None
            if budget and self.measurement is not None:
                limit = self.measurement.limit(slot, held)
            free.append(budget if limit is None else max(0, min(budget, limit)))
        return free

    def foreign_cuts(self) -> Mapping[int, int]:
        """Per slot position, the bytes held outside cohabit where that cut the free budget
        below what the reservations alone leave (what a NoFit names)."""
        if self.measurement is None:
            return {}
        used = self.used_bytes()
        cuts: dict[int, int] = {}
        for slot, free in zip(self.slots, self.free_bytes(), strict=True):
            measured = self.measurement.slots.get(slot.key)
            held = used.get(slot.key, 0)
            if measured is None or not measured.foreign_bytes or (slot.exclusive and held):
                continue
            if free < slot.capacity_bytes - held:
                cuts[slot.position] = measured.foreign_bytes
        return cuts

    def with_measurement(self, measurement: Measurement | None) -> FleetState:
        """The same fleet and reservations, bounded by `measurement` (None: by nothing)."""
        if measurement is self.measurement:
            return self
        return self._derived(self.reservations, measurement)

    def with_reservations(self, reservations: Iterable[Reservation]) -> FleetState:
        return self._derived((*self.reservations, *reservations), self.measurement)

    def without(self, deployment: str) -> FleetState:
        """A new state in which `deployment` holds nothing."""
        kept = tuple(r for r in self.reservations if r.deployment != deployment)
        return self._derived(kept, self.measurement)

    def _derived(
        self, reservations: tuple[Reservation, ...], measurement: Measurement | None
    ) -> FleetState:
        """A state of the same fleet, sharing this one's slots: listing a large fleet's slots
        is most of what building a state costs, and a decision derives several."""
        state = object.__new__(FleetState)
        object.__setattr__(state, "fleet", self.fleet)
        object.__setattr__(state, "reservations", reservations)
        object.__setattr__(state, "measurement", measurement)
        object.__setattr__(state, "slots", self.slots)
        return state


def free_budget(slot: Slot, held_bytes: int) -> int:
    """What a slot holding `held_bytes` has free: an exclusive slot holding anything is full;
    an over-reserved slot (its capacity shrank) has zero free, never less."""
    if slot.exclusive and held_bytes:
        return 0
    return max(0, slot.capacity_bytes - held_bytes)
