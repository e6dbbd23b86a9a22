"""Preemption: when a request fits nowhere, the cheapest set of idle copies to unload so that
it fits, and the placement it then gets — or a `NoFit` that says why unloading cannot help.

A copy may be unloaded for a request of priority p when it has no request in flight and its
priority is below p, or equal to p while its deployment scales to zero (min_copies 0: it
agreed to be unloaded). Never a busy copy, never a higher priority. The control plane
(the reconciler) gathers the copies and their idleness, calls `plan_with_preemption()`,
unloads the victims and reserves the placement; nothing here does I/O or reads a clock.

The cheapest set, in this order: accelerators before CPU pools (as the planner), fewest
copies, the lowest priority among them, fewest bytes released, then the least recently used
(the set whose most recently used copy has been idle longest). For a single-device request
this is exact: a set that makes some device fit is never cheaper than its part on that
device, so the search runs device by device — over every subset of the device's smallest
size, unless there are more than `EXACT_SUBSETS` of them (then the largest copies first).
Tensor-parallel requests take the cheapest set per device over the node's N cheapest
devices, checked by the planner.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import partial

from cohabit.hardware.model import HardwareClass
from cohabit.hardware.slots import Slot, SlotKey, SlotKind
from cohabit.placement.decision import Decision, Placement
from cohabit.placement.filters import static_reason
from cohabit.placement.planner import Planner, never_fits
from cohabit.placement.reasons import NoFit, PreemptionBlock, PreemptionNote
from cohabit.placement.request import PlacementRequest
from cohabit.placement.scoring import Policy
from cohabit.placement.state import FleetState, free_budget
from cohabit.units import format_duration

# Subsets of one device's copies tried exactly; beyond this the largest copies are taken.
EXACT_SUBSETS = 2_000
# Options the planner checks before the fallback (only tensor-parallel options can fail).
MAX_TRIES = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A running copy that holds reservations in the state, as preemption sees it.

    `deployment` matches its reservations' `deployment`; `name` is what messages show;
    `scale_to_zero`: its deployment has min_copies 0; `idle_s`: since its last request (or
    since it was loaded, if none came).
    """

    deployment: str
    name: str
    priority: int = 0
    scale_to_zero: bool = False
    idle_s: float = 0.0
    in_flight: int = 0


class Verdict(StrEnum):
    """Whether a copy may be unloaded for a request, and if not, why."""

    IDLE = "idle"
    BUSY = "busy"
    HIGHER_PRIORITY = "higher priority"
    KEPT = "same priority, keeps its copies"


def verdict(candidate: Candidate, priority: int) -> Verdict:
    """The rule: lower priority, or equal and scale-to-zero; and no request in flight."""
    if candidate.priority > priority:
        return Verdict.HIGHER_PRIORITY
    if candidate.priority == priority and not candidate.scale_to_zero:
        return Verdict.KEPT
    if candidate.in_flight > 0:
        return Verdict.BUSY
    return Verdict.IDLE


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    """A placement that holds once `victims` are unloaded (none when it fit as things are).

    `released_bytes` counts every byte the victims hold, on any device."""

    placement: Placement
    victims: tuple[Candidate, ...]
    released_bytes: int

    placed = True

    @property
    def explanation(self) -> str:
        """ "placed on node-a gpu 0 after unloading tiny-b (priority 0, idle 12 min)" """
        where = ", ".join(a.slot.location for a in self.placement.allocations)
        if not self.victims:
            return f"placed on {where}"
        return f"placed on {where} after unloading {victims_text(self.victims)}"


def victims_text(victims: Sequence[Candidate]) -> str:
    """ "tiny-b (priority 0, idle 12 min) and tiny-c (priority 0, idle 3 min)" """
    unloaded = [
        f"{v.name} (priority {v.priority}, idle {format_duration(v.idle_s)})" for v in victims
    ]
    if len(unloaded) == 1:
        return unloaded[0]
    return f"{', '.join(unloaded[:-1])} and {unloaded[-1]}"


CostKey = tuple[int, int, int, int, tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class _Option:
    cost: CostKey
    position: int
    victims: tuple[Candidate, ...]


class _Search:
    """One request against one state: who holds what where, the per-device search, and
    trials of the planner with some copies gone (its free index changed in place for the
    trial and put back after, so a trial costs a few index updates, not a new planner)."""

    def __init__(
        self,
        planner: Planner,
        state: FleetState,
        request: PlacementRequest,
        priority: int,
        candidates: Iterable[Candidate],
    ) -> None:
        self.planner = planner
        self.slots = state.slots
        self.request = request
        self.priority = priority
        self.by_id = {c.deployment: c for c in candidates}
        position_of = {slot.key: slot.position for slot in state.slots}
        # Per slot position: bytes each deployment holds there; per deployment: where.
        # Reservations on slots the fleet no longer has count against nothing, so unloading
        # them frees nothing (but they are still released).
        self.held: list[dict[str, int]] = [{} for _ in state.slots]
        self.where: dict[str, list[tuple[int, int]]] = {}
        self.released: dict[str, int] = {}
        for reservation in state.reservations:
            owner, size = reservation.deployment, reservation.reserved_bytes
            self.released[owner] = self.released.get(owner, 0) + size
            position = position_of.get(reservation.slot_key)
            if position is not None:
                holders = self.held[position]
                holders[owner] = holders.get(owner, 0) + size
                self.where.setdefault(owner, []).append((position, size))
        index = planner.index
        passing = [static_reason(request, g.representative) is None for g in index.groups]
        self.usable = [slot for slot in state.slots if passing[index.group_of[slot.position]]]

    def idle(self, deployment: str) -> Candidate | None:
        candidate = self.by_id.get(deployment)
        if candidate is None or verdict(candidate, self.priority) is not Verdict.IDLE:
            return None
        return candidate

    def cost(self, tier: int, victims: Sequence[Candidate]) -> CostKey:
        return _cost(tier, victims, self.released)

    def decide_without(self, victims: Iterable[Candidate]) -> Decision:
        """The planner's decision were `victims` unloaded."""
        gone: dict[int, int] = {}
        for victim in victims:
            for position, size in self.where.get(victim.deployment, ()):
                gone[position] = gone.get(position, 0) + size
        index = self.planner.index
        saved = {position: index.free[position] for position in gone}
        try:
            for position, size in gone.items():
                remaining = sum(self.held[position].values()) - size
                index.set_free(position, free_budget(self.slots[position], remaining))
            return self.planner.decide(self.request)
        finally:
            for position, free in saved.items():
                index.set_free(position, free)

    def slot_option(self, slot: Slot, tier: int) -> _Option | None:
        """The cheapest set of idle copies whose unloading makes `slot` hold the request."""
        need = self.request.vram_bytes
        if slot.capacity_bytes < need:
            return None
        unloadable: list[tuple[Candidate, int]] = []
        kept_bytes = 0
        for deployment, held in self.held[slot.position].items():
            candidate = self.idle(deployment)
            if candidate is None:
                kept_bytes += held
            else:
                unloadable.append((candidate, held))
        if slot.exclusive:
            if kept_bytes:
                return None
            everyone = tuple(c for c, _ in unloadable)
            return _Option(self.cost(tier, everyone), slot.position, everyone)
        # Bytes that must go: what stays plus the request must fit the capacity.
        short = kept_bytes + sum(b for _, b in unloadable) + need - slot.capacity_bytes
        if short <= 0:
            return _Option(self.cost(tier, ()), slot.position, ())
        found = _cheapest_subset(unloadable, short, lambda vs: self.cost(tier, vs))
        if found is None:  # even all of them would not free enough here
            return None
        return _Option(found[1], slot.position, found[0])

    def options(self) -> list[_Option]:
        """Every device's (or, tensor parallel, every node's) cheapest set, cheapest first."""
        found: list[_Option] = []
        if self.request.tensor_parallel == 1:
            for slot in self.usable:
                option = self.slot_option(slot, _tier(slot))
                if option is not None:
                    found.append(option)
        else:
            found = self._sharded_options()
        found.sort(key=lambda o: (o.cost, o.position))
        return found

    def _sharded_options(self) -> list[_Option]:
        shards = self.request.tensor_parallel
        by_node: dict[int, list[_Option]] = {}
        for slot in self.usable:
            if slot.kind is SlotKind.GPU:
                option = self.slot_option(slot, 0)
                if option is not None:
                    by_node.setdefault(slot.node_order, []).append(option)
        found: list[_Option] = []
        for node_order, per_device in by_node.items():
            if len(per_device) < shards:
                continue
            per_device.sort(key=lambda o: (o.cost, o.position))
            union: dict[str, Candidate] = {}
            for option in per_device[:shards]:
                union.update((v.deployment, v) for v in option.victims)
            victims = tuple(union.values())
            found.append(_Option(self.cost(0, victims), node_order, victims))
        return found

    def trimmed(self, victims: Sequence[Candidate], placement: Placement) -> Preemption:
        """From a set that places the request, keep loaded every victim it fits without: the
        most valuable first (highest priority, then most recently used)."""
        chosen = list(victims)
        for keep in sorted(victims, key=lambda v: (-v.priority, v.idle_s)):
            trial = [v for v in chosen if v is not keep]
            decision = self.decide_without(trial)
            if isinstance(decision, Placement):
                chosen, placement = trial, decision
        return self.preemption(placement, chosen)

    def note(self, no_fit_with_all_idle_gone: NoFit) -> PreemptionNote:
        """Why no set helps: counts of the copies on devices the request may use."""
        counts = dict.fromkeys(Verdict, 0)
        others: set[str] = set()
        seen: set[str] = set()
        for slot in self.usable:
            for deployment in self.held[slot.position]:
                if deployment in seen:
                    continue
                seen.add(deployment)
                candidate = self.by_id.get(deployment)
                if candidate is None:
                    others.add(deployment)
                else:
                    counts[verdict(candidate, self.priority)] += 1
        idle = counts[Verdict.IDLE]
        return PreemptionNote(
            block=PreemptionBlock.NOT_ENOUGH if idle else PreemptionBlock.NO_CANDIDATES,
            priority=self.priority,
            requested_bytes=self.request.vram_bytes,
            idle_copies=idle,
            busy_copies=counts[Verdict.BUSY],
            higher_priority_copies=counts[Verdict.HIGHER_PRIORITY],
            kept_copies=counts[Verdict.KEPT],
            other_holders=len(others),
            largest_free_bytes=no_fit_with_all_idle_gone.largest_free_bytes,
            largest_free_location=no_fit_with_all_idle_gone.largest_free_location,
        )

    def preemption(self, placement: Placement, victims: Sequence[Candidate]) -> Preemption:
        ordered = tuple(sorted(victims, key=lambda v: (-v.idle_s, v.name, v.deployment)))
        return Preemption(
            placement=placement,
            victims=ordered,
            released_bytes=sum(self.released.get(v.deployment, 0) for v in ordered),
        )


def plan_with_preemption(
    state: FleetState,
    request: PlacementRequest,
    *,
    priority: int = 0,
    candidates: Iterable[Candidate] = (),
    policy: Policy = Policy.BINPACK,
) -> Preemption | NoFit:
    """Place `request` (of `priority`) against `state`, unloading the cheapest set of idle
    `candidates` when it does not fit as things are. The placement is the planner's own on
    the state without the victims; a `NoFit` is the one the request gets today, with a
    `PreemptionNote` saying why unloading could not help."""
    planner = Planner(state, policy=policy)
    decision = planner.decide(request)
    if isinstance(decision, Placement):
        return Preemption(placement=decision, victims=(), released_bytes=0)
    search = _Search(planner, state, request, priority, candidates)
    for option in search.options()[:MAX_TRIES]:
        placed = search.decide_without(option.victims)
        if isinstance(placed, Placement):
            return search.preemption(placed, option.victims)
    every_idle = [c for c in search.by_id.values() if search.idle(c.deployment)]
    after = search.decide_without(every_idle)
    if isinstance(after, Placement):  # the per-device sets missed (tensor parallel): trim
        return search.trimmed(every_idle, after)
    if never_fits(state.fleet, request) is not None:
        note = PreemptionNote(
            block=PreemptionBlock.NEVER_FITS, priority=priority, requested_bytes=request.vram_bytes
        )
        return replace(decision, preemption=note)
    return replace(decision, preemption=search.note(after))


def room_on_slots(
    state: FleetState,
    needed: Mapping[SlotKey, int],
    *,
    priority: int = 0,
    candidates: Iterable[Candidate] = (),
) -> tuple[Candidate, ...] | None:
    """The cheapest set of idle `candidates` (the rule and the order above) whose unloading
    leaves each slot of `needed` room for that many bytes beside what stays there: a sleeping
    copy taking its budget back on the devices it holds, which no other device will do
    (placement/residency.py, `room_to_wake`; `state` holds the others only). Empty when it
    fits as things are; None when unloading every idle copy there would not do. A 16 GiB
    card holding idle copies of 10 and 4 GiB: 10 GiB needed unloads the 10 GiB one alone."""
    by_id = {c.deployment: c for c in candidates}
    by_key = {slot.key: slot for slot in state.slots}
    held: dict[SlotKey, dict[str, int]] = {}
    released: dict[str, int] = {}
    for reservation in state.reservations:
        owner, size = reservation.deployment, reservation.reserved_bytes
        released[owner] = released.get(owner, 0) + size
        holders = held.setdefault(reservation.slot_key, {})
        holders[owner] = holders.get(owner, 0) + size
    chosen: dict[str, Candidate] = {}
    for key, need in needed.items():
        slot = by_key.get(key)
        if slot is None:
            continue  # a device the fleet no longer has counts against nothing
        if slot.capacity_bytes < need:
            return None
        unloadable: list[tuple[Candidate, int]] = []
        kept_bytes = 0
        for deployment, size in held.get(key, {}).items():
            candidate = by_id.get(deployment)
            if candidate is None or verdict(candidate, priority) is not Verdict.IDLE:
                kept_bytes += size
            else:
                unloadable.append((candidate, size))
        tier = _tier(slot)
        if slot.exclusive:
            if kept_bytes:
                return None
            victims: tuple[Candidate, ...] = tuple(c for c, _ in unloadable)
        else:
            short = kept_bytes + sum(b for _, b in unloadable) + need - slot.capacity_bytes
            if short <= 0:
                continue
            found = _cheapest_subset(unloadable, short, partial(_cost, tier, released=released))
            if found is None:
                return None
            victims = found[0]
        chosen.update((v.deployment, v) for v in victims)
    return tuple(sorted(chosen.values(), key=lambda v: (-v.idle_s, v.name, v.deployment)))


def _cost(tier: int, victims: Sequence[Candidate], released: Mapping[str, int]) -> CostKey:
    """A set's place in the cheapest-first order (the module docstring): the tier, how
    many, their highest priority, the bytes they release, then their idleness."""
    return (
        tier,
        len(victims),
        max((v.priority for v in victims), default=0),
        sum(released.get(v.deployment, 0) for v in victims),
        tuple(-idle for idle in sorted(v.idle_s for v in victims)),
    )


def _tier(slot: Slot) -> int:
    """Accelerators before CPU pools, as the planner."""
    return 1 if slot.hardware_class is HardwareClass.CPU else 0


def _cheapest_subset(
    unloadable: list[tuple[Candidate, int]],
    short: int,
    cost: Callable[[Sequence[Candidate]], CostKey],
) -> tuple[tuple[Candidate, ...], CostKey] | None:
    """The cheapest subset whose bytes on this device reach `short`, or None when all of them
    together do not. Its size is the fewest copies that can (the largest first); among subsets
    of that size the cheapest by `cost`, over all of them when there are at most
    `EXACT_SUBSETS`, else the largest copies of the lowest priority that still allows it."""
    by_size = sorted(unloadable, key=lambda item: -item[1])
    if sum(b for _, b in by_size) < short:
        return None
    fewest = _fewest(by_size, short)
    # The lowest priority cap that still allows a set of that size (the highest always does).
    allowed = by_size
    for cap in sorted({c.priority for c, _ in by_size}):
        allowed = [item for item in by_size if item[0].priority <= cap]
        if _fewest(allowed, short) == fewest:
            break
    if fewest is None:
        return None
    if math.comb(len(allowed), fewest) > EXACT_SUBSETS:
        largest = tuple(c for c, _ in allowed[:fewest])
        return largest, cost(largest)
    best: tuple[tuple[Candidate, ...], CostKey] | None = None
    for subset in itertools.combinations(allowed, fewest):
        if sum(b for _, b in subset) < short:
            continue
        victims = tuple(c for c, _ in subset)
        key = cost(victims)
        if best is None or key < best[1]:
            best = (victims, key)
    return best


def _fewest(by_size: list[tuple[Candidate, int]], short: int) -> int | None:
    """How many of these copies (largest first) it takes to reach `short`; None if all fall
    short."""
    total = 0
    for count, (_, held) in enumerate(by_size, start=1):
        total += held
        if total >= short:
            return count
    return None
