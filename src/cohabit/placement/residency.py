"""Residency: what a sleeping engine still holds, and whether its wake fits (pure).

A copy that sleeps instead of unloading keeps its process and a residue on its devices
(the CUDA context, CUDA graphs and library workspaces: what vLLM's sleep does not hand back);
at level 1 its weights wait in the node's host memory. Its reservation shrinks to the residue,
so the rest of its budget is free for others, and a wake must take the whole budget back —
checked here against the others' reservations, then written by the ledger in the same locked
transaction (store/residency.py). The control loop chooses the level with `sleep_level`,
and, making room for a request that does not fit, tries `room_by_sleeping` before
preemption unloads anyone; for a wake that does not fit, `room_to_wake` does the same on the
devices the copy sleeps on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from cohabit.hardware.model import Node
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.preemption import Candidate, Verdict, room_on_slots, verdict
from cohabit.placement.reasons import FilterCode, Reason
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import format_gib


class SleepLevel(IntEnum):
    """vLLM's sleep levels (vllm/v1/engine/core.py, `EngineCore.sleep`)."""

    OFFLOAD = 1  # weights copied to host memory, KV cache discarded: wakes in about a second
    DISCARD = 2  # weights and KV cache discarded: a wake reads the weights from disk again


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeShortfall:
    """A wake that does not fit: the devices whose free budget cannot take the copy's
    budget back, each a `Reason` with the requested, free and capacity bytes."""

    deployment: str
    reasons: tuple[Reason, ...]

    placed = False

    @property
    def message(self) -> str:
        """One line: `cannot wake: node-a gpu 0 has 10 GiB free of 80 GiB, 24 GiB needed`."""
        parts = [
            f"{reason.location} has {format_gib(reason.free_bytes)} free of "
            f"{format_gib(reason.capacity_bytes)}, {format_gib(reason.requested_bytes)} needed"
            for reason in self.reasons
        ]
        return "cannot wake: " + "; ".join(parts)


def host_budget_bytes(node: Node) -> int | None:
    """The host memory sleeping engines on `node` may park weights in: its memory less what
    is kept for the OS. None when the node's host memory is unknown (then nothing goes there)."""
    if node.memory_bytes is None:
        return None
    return max(0, node.memory_bytes - node.os_reserve_bytes)


def host_held_bytes(state: FleetState, node: str) -> int:
    """The weights sleeping engines keep in `node`'s host memory now."""
    return sum(r.host_bytes for r in state.reservations if r.node == node)


def sleep_level(state: FleetState, *, node: str, weights_bytes: int) -> SleepLevel:
    """Level 1 when the node's host memory budget can take `weights_bytes` beside what other
    sleepers keep there (a fast wake), else level 2 (the weights are read again on waking).
    Llama-3.1-8B bf16 on a 64 GiB host holding one 15 GiB sleeper: 15 GiB more fits, level 1.
    """
    by_name = {n.name: n for n in state.fleet.nodes}
    found = by_name.get(node)
    budget = None if found is None else host_budget_bytes(found)
    if budget is None or weights_bytes <= 0:
        return SleepLevel.DISCARD
    if host_held_bytes(state, node) + weights_bytes <= budget:
        return SleepLevel.OFFLOAD
    return SleepLevel.DISCARD


def wake_shortfall(state: FleetState, deployment: str) -> WakeShortfall | None:
    """None when every device `deployment` sleeps on has room to take its budget back (what
    the others hold, measured or reserved, counted as for any placement); else why not.
    Reservations on slots the fleet no longer has count against nothing."""
    asleep = [r for r in state.reservations if r.deployment == deployment and r.asleep]
    if not asleep:
        return None
    others = state.without(deployment)
    free = others.free_bytes()
    by_key = {slot.key: slot for slot in state.slots}
    needed: dict[tuple[str, int | None, int | None], int] = {}
    for reservation in asleep:
        budget = reservation.budget_bytes or 0
        needed[reservation.slot_key] = needed.get(reservation.slot_key, 0) + budget
    reasons = []
    for key, budget in needed.items():
        slot = by_key.get(key)
        if slot is None or free[slot.position] >= budget:
            continue
        reasons.append(
            Reason(
                code=FilterCode.INSUFFICIENT_GPU_MEMORY,
                location=slot.location,
                requested_bytes=budget,
                free_bytes=free[slot.position],
                capacity_bytes=slot.capacity_bytes,
            )
        )
    if not reasons:
        return None
    return WakeShortfall(deployment=deployment, reasons=tuple(reasons))


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepRoom:
    """A placement that holds once `sleepers` are put to sleep (each keeps its residue)."""

    placement: Placement
    sleepers: tuple[Candidate, ...]


def room_by_sleeping(
    state: FleetState,
    request: PlacementRequest,
    *,
    priority: int,
    candidates: Sequence[Candidate],
    residue_bytes: Mapping[str, int],
) -> SleepRoom | None:
    """Make room for `request` by putting idle copies to sleep rather than unloading them:
    the copies that could sleep (`residue_bytes` names them, with what each keeps per
    device) and that preemption's rule lets go for `priority`, longest idle first, as few as
    fit it. None when sleeping all of them would not (preemption then unloads instead).
    A 16 GiB card holding a 10 GiB idle sleeper: a 6 GiB request fits once it sleeps with
    a 1 GiB residue (5 GiB freed beside the 6 free)."""
    eligible = sorted(
        (
            c
            for c in candidates
            if c.deployment in residue_bytes and verdict(c, priority) is Verdict.IDLE
        ),
        key=lambda c: (-c.idle_s, c.deployment),
    )
    chosen: list[Candidate] = []
    current = state
    for candidate in eligible:
        current = _asleep(current, candidate.deployment, residue_bytes[candidate.deployment])
        chosen.append(candidate)
        decision = plan(current, request)
        if isinstance(decision, Placement):
            return SleepRoom(placement=decision, sleepers=tuple(chosen))
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeRoom:
    """Room for a wake: `sleepers` to put to sleep, or else `victims` to unload (at most one
    of the two is not empty; both are when the wake fits as things are)."""

    sleepers: tuple[Candidate, ...] = ()
    victims: tuple[Candidate, ...] = ()


def room_to_wake(
    state: FleetState,
    deployment: str,
    *,
    priority: int,
    candidates: Sequence[Candidate],
    residue_bytes: Mapping[str, int],
) -> WakeRoom | None:
    """Make room for a sleeping `deployment` to take its budget back, as a placement's room
    is made, on the only devices a wake can use — its own: idle copies there that could
    sleep (`residue_bytes`) and that preemption's rule lets go for `priority` are put to
    sleep, longest idle first, as few as fit it; else the cheapest set of idle copies there
    is unloaded (`preemption.room_on_slots`). None when neither would do. Trials count
    reservations only: the ledger checks the measured figures when the budget is taken back.
    A 24 GiB card: a sleeper of an 18 GiB budget beside an idle 10 GiB copy that can sleep
    wakes once that copy sleeps with a 1 GiB residue (1 + 1 + 18 of 24 GiB)."""
    if wake_shortfall(state, deployment) is None:
        return WakeRoom()
    others = [c for c in candidates if c.deployment != deployment]
    mine = [r for r in state.reservations if r.deployment == deployment and r.asleep]
    devices = {r.slot_key for r in mine}
    beside = {r.deployment for r in state.reservations if r.slot_key in devices}
    eligible = sorted(
        (
            c
            for c in others
            if c.deployment in residue_bytes
            and c.deployment in beside
            and verdict(c, priority) is Verdict.IDLE
        ),
        key=lambda c: (-c.idle_s, c.deployment),
    )
    current = state
    chosen: list[Candidate] = []
    for candidate in eligible:
        current = _asleep(current, candidate.deployment, residue_bytes[candidate.deployment])
        chosen.append(candidate)
        if wake_shortfall(current, deployment) is None:
            return WakeRoom(sleepers=tuple(chosen))
    needed: dict[tuple[str, int | None, int | None], int] = {}
    for reservation in mine:
        key = reservation.slot_key
        needed[key] = needed.get(key, 0) + (reservation.budget_bytes or 0)
    victims = room_on_slots(state.without(deployment), needed, priority=priority, candidates=others)
    if victims is None:
        return None
    gone = state
    for victim in victims:
        gone = gone.without(victim.deployment)
    if wake_shortfall(gone, deployment) is not None:
        return None
    return WakeRoom(victims=victims)


def _asleep(state: FleetState, deployment: str, residue_bytes: int) -> FleetState:
    """`state` with `deployment`'s reservations shrunk to the residue, as a sleep leaves them."""
    held = [r for r in state.reservations if r.deployment == deployment and not r.asleep]
    shrunk = (
        Reservation(
            deployment=r.deployment,
            node=r.node,
            gpu_index=r.gpu_index,
            partition_index=r.partition_index,
            reserved_bytes=min(residue_bytes, r.reserved_bytes),
            budget_bytes=r.reserved_bytes,
        )
        for r in held
    )
    return state.without(deployment).with_reservations(
        (*[r for r in state.reservations if r.deployment == deployment and r.asleep], *shrunk)
    )
