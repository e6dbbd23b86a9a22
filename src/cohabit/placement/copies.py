"""Placing the copies of one deployment: one decision for all of them, spread out.

Each copy is planned against the state the previous ones left, preferring first a node no
sibling copy holds, then a device no sibling holds, and only when neither fits a device a
sibling already holds (the explanation says which). The decision is all or nothing: when one
copy does not fit, `CopiesNoFit` says how many did and why the next one did not. Pure: the
caller reserves the placements in one transaction (store/copies.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from cohabit.hardware.slots import Slot, SlotKey
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Reservation

HIDDEN = "(held by a sibling copy)"  # the owner of the stand-in reservations below


class Spread(StrEnum):
    """How far a copy landed from its siblings."""

    FIRST = "first"  # no sibling holds anything yet
    NEW_NODE = "new_node"  # a node no sibling holds
    NEW_DEVICE = "new_device"  # a device no sibling holds, on a node one does
    SHARED = "shared"  # a device a sibling holds: nothing else had room

    def words(self) -> str:
        return {
            Spread.FIRST: "",
            Spread.NEW_NODE: "a node no other copy holds",
            Spread.NEW_DEVICE: "a device no other copy holds",
            Spread.SHARED: "beside another copy: no device without one had room",
        }[self]


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyPlacement:
    """One copy's placement and how it spreads from its siblings."""

    placement: Placement
    spread: Spread

    @property
    def explanation(self) -> str:
        locations = ", ".join(a.slot.location for a in self.placement.allocations)
        words = self.spread.words()
        return f"on {locations}, {words}" if words else f"on {locations}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CopiesNoFit:
    """Not every copy fits: how many did (in order), and why the next one did not."""

    wanted: int
    fit: int
    no_fit: NoFit

    @property
    def message(self) -> str:
        return f"only {self.fit} of {self.wanted} copies fit: {self.no_fit.message}"


def _device(slot_key: SlotKey) -> tuple[str, int | None, int | None]:
    """A slot's physical device: a GPU (whatever partition of it), or the slot itself."""
    node, gpu, partition = slot_key
    return (node, gpu, None) if gpu is not None else (node, gpu, partition)


def _hiding(state: FleetState, hide: Iterable[Slot]) -> FleetState:
    """`state` with these slots full (stand-in reservations of their whole capacity)."""
    return state.with_reservations(
        Reservation(
            deployment=HIDDEN,
            node=slot.node,
            gpu_index=slot.gpu_index,
            partition_index=slot.partition_index,
            reserved_bytes=slot.capacity_bytes,
        )
        for slot in hide
    )


def plan_copy(
    state: FleetState, request: PlacementRequest, siblings: Iterable[SlotKey]
) -> CopyPlacement | NoFit:
    """One copy against `state`, spread away from the slots its siblings hold. A spread
    placement never trades down the hardware the plain one gets (a CPU pool instead of
    sharing a GPU with a sibling)."""
    held = set(siblings)
    nodes = {key[0] for key in held}
    devices = {_device(key) for key in held}
    plain = plan(state, request)
    if isinstance(plain, NoFit):
        return plain
    if not held:
        return CopyPlacement(placement=plain, spread=Spread.FIRST)
    tiers = [
        (Spread.NEW_NODE, [s for s in state.slots if s.node in nodes]),
        (Spread.NEW_DEVICE, [s for s in state.slots if _device(s.key) in devices]),
    ]
    for spread, hide in tiers:
        if not hide:
            continue  # nothing to avoid: the next tier decides
        decision = plan(_hiding(state, hide), request)
        if isinstance(decision, Placement) and decision.hardware_class is plain.hardware_class:
            return CopyPlacement(placement=decision, spread=spread)
    keys = {_device(a.slot.key) for a in plain.allocations}
    if keys & devices:
        return CopyPlacement(placement=plain, spread=Spread.SHARED)
    spread = Spread.NEW_DEVICE if plain.node in nodes else Spread.NEW_NODE
    return CopyPlacement(placement=plain, spread=spread)


def plan_copies(
    state: FleetState,
    requests: Sequence[PlacementRequest],
    *,
    siblings: Iterable[SlotKey] = (),
) -> list[CopyPlacement] | CopiesNoFit:
    """Every request (one per copy, named by the copy) against `state` in order, each
    against what the previous left and spread from the slots already held by `siblings`
    and by the copies placed before it; all of them, or `CopiesNoFit`."""
    held = list(siblings)
    placed: list[CopyPlacement] = []
    for request in requests:
        decision = plan_copy(state, request, held)
        if isinstance(decision, NoFit):
            return CopiesNoFit(wanted=len(requests), fit=len(placed), no_fit=decision)
        placed.append(decision)
        state = state.with_reservations(decision.placement.reservations())
        held.extend(a.slot.key for a in decision.placement.allocations)
    return placed
