"""Making room for a deployment that does not fit: unloading idle copies of lower priority
(preemption), and the queue of deployments that asked to wait (`queue: true`).

The reconciler calls `RoomMaker.make_room()` when a placement finds no fit, and the warm tier
`make_room_to_wake()` when a sleeping copy's budget does not fit back on its devices. The running
deployments become preemption candidates (placement/preemption.py decides, purely); the
victims are unloaded like idle ones (`Driver.unload`, service/control/driver.py), then the
placement is reserved in the ledger's transaction as any other. A race lost on the way (a
victim got a request, someone else took the room) sends the deployment back to REQUESTED, so
the next pass tries again.

Queued deployments are tried every pass in priority then arrival order, a turn at a time
(placement/turns.py decides which is placed next); one that does not fit blocks nobody behind
it: a lower-priority deployment placed meanwhile is itself an idle copy the higher one may
unload later.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cohabit.placement.decision import Placement
from cohabit.placement.preemption import (
    Candidate,
    Preemption,
    plan_with_preemption,
    victims_text,
)
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.residency import room_by_sleeping, room_to_wake
from cohabit.placement.state import FleetState
from cohabit.placement.turns import Passed, Waiting, next_turn
from cohabit.service.control import timeline
from cohabit.service.control.copies import with_copies
from cohabit.service.control.failures import no_fit_failure
from cohabit.service.control.lifetime import Lifetime, idle_s
from cohabit.service.control.warm import residue_bytes
from cohabit.service.errors import InvalidInput
from cohabit.store import copies, deployments, ledger, queue
from cohabit.store.database import utcnow
from cohabit.store.events import EventKind
from cohabit.store.records import (
    DeploymentFailure,
    DeploymentRecord,
)

if TYPE_CHECKING:
    from cohabit.service.control.driver import Driver

log = logging.getLogger(__name__)

# Placements retried after a lost race before the NoFit stands.
MAX_ROOM_TRIES = 3


def queue_message(position: int, waiting: int, failure_message: str) -> str:
    """ "queued at position 2 of 3: insufficient_capacity: 0/1 nodes fit: …" """
    return f"queued at position {position} of {waiting}: {failure_message}"


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a queue's turns depend on: the queued records, the fleet with its reservations
    and measurements, and the copies preemption may unload, as far as whether they may be
    unloaded goes (their idle time orders victims, it never decides whether one fits)."""

    waiting: tuple[DeploymentRecord, ...]
    state: FleetState
    candidates: tuple[Candidate, ...]

    @classmethod
    def of(
        cls, waiting: list[DeploymentRecord], state: FleetState, candidates: list[Candidate]
    ) -> QueueView:
        unloadable = tuple(replace(c, idle_s=0.0) for c in candidates)
        return cls(waiting=tuple(waiting), state=state, candidates=unloadable)


class RoomMaker:
    """Preemption and the queue, for one reconciler (whose pass lock it runs under)."""

    def __init__(self, reconciler: Driver, lifetime: Lifetime) -> None:
        self.reconciler = reconciler
        self.lifetime = lifetime  # how long each candidate has been idle
        self._tries: dict[str, int] = {}
        self._quiet: QueueView | None = None  # the last queue served that placed nothing
        # The explanation of a placement that unloaded idle copies, for its `placed` event.
        self.explained: dict[str, tuple[str, dict[str, Any]]] = {}

    def candidates(self) -> list[Candidate]:
        """Every DEPLOYED deployment, as preemption sees it: priority, whether it agreed to be
        unloaded (min_copies 0), idle seconds and requests in flight here."""
        reconciler = self.reconciler
        found: list[Candidate] = []
        now = utcnow()
        for record in deployments.list_deployed(reconciler.db):
            idle = idle_s(self.lifetime.use_of(record), now)
            found.append(
                Candidate(
                    deployment=record.id,
                    name=record.model_name,
                    priority=record.scaling.priority,
                    scale_to_zero=record.scaling.min_copies == 0,
                    idle_s=0.0 if idle is None else idle,
                    in_flight=reconciler.activity.in_flight(record.deployment_id),
                )
            )
        return found

    def make_room(
        self, record: DeploymentRecord, wanted: PlacementRequest, no_fit: NoFit
    ) -> Placement | NoFit | None:
        """For a DEPLOYING deployment of this reconciler that did not fit: unload the cheapest
        set of idle copies that makes it fit and reserve its placement. The NoFit (saying why
        preemption could not help) when none does; None when it goes back to REQUESTED to be
        tried again (a race was lost) or is no longer this reconciler's."""
        reconciler = self.reconciler
        priority = record.scaling.priority
        measurement = reconciler.measurement()  # memory held outside cohabit counts here too
        state = ledger.current_state(reconciler.db).with_measurement(measurement)
        slept = self._room_by_sleeping(record, wanted, state)
        if slept is not None:
            return slept
        state = ledger.current_state(reconciler.db).with_measurement(measurement)
        found = plan_with_preemption(state, wanted, priority=priority, candidates=self.candidates())
        if isinstance(found, NoFit):
            self._tries.pop(record.id, None)
            return found
        reason = f"preempted by {record.model_name} (priority {priority})"
        unloaded = all(reconciler.unload(v.deployment, reason=reason) for v in found.victims)
        decision = None
        if unloaded:
            decision = ledger.reserve(
                reconciler.db,
                deployment_id=record.id,
                owner=reconciler.owner,
                request=wanted,
                measurement=measurement,
            )
        if isinstance(decision, Placement):
            self._tries.pop(record.id, None)
            if found.victims:
                self._placed(record, found)
            return decision
        if decision is None and unloaded:
            return None  # no longer ours to place (stopped meanwhile)
        tries = self._tries[record.id] = self._tries.get(record.id, 0) + 1
        if tries >= MAX_ROOM_TRIES:
            self._tries.pop(record.id, None)
            return no_fit
        log.info("making room for %s lost a race; trying again on the next pass", record.id)
        reconciler.retry_later(record.id)
        return None

    def _room_by_sleeping(
        self, record: DeploymentRecord, wanted: PlacementRequest, state: FleetState
    ) -> Placement | None:
        """Put idle vLLM copies to sleep rather than unload them when that makes room
        (placement/residency.py: `room_by_sleeping`), and reserve the placement; None when it
        cannot, or did not (then preemption proper goes on from the ledger as it is now)."""
        warm, reconciler = self.lifetime.warm, self.reconciler
        if warm is None or not warm.enabled:
            return None
        deployed = {r.id: r for r in deployments.list_deployed(reconciler.db)}
        residues = {i: residue_bytes(r) for i, r in deployed.items() if warm.can_sleep(r)}
        if not residues:
            return None
        priority = record.scaling.priority
        found = room_by_sleeping(
            state,
            wanted,
            priority=priority,
            candidates=self.candidates(),
            residue_bytes=residues,
        )
        if found is None:
            return None
        reason = f"preempted by {record.model_name} (priority {priority})"
        if not all(warm.sleep(deployed[c.deployment], reason=reason) for c in found.sleepers):
            return None
        decision = ledger.reserve(
            reconciler.db,
            deployment_id=record.id,
            owner=reconciler.owner,
            request=wanted,
            measurement=reconciler.measurement(),
        )
        if not isinstance(decision, Placement):
            return None
        where = ", ".join(a.slot.location for a in decision.allocations)
        names = " and ".join(c.name for c in found.sleepers)
        slept = [{"deployment_id": c.deployment, "name": c.name} for c in found.sleepers]
        self.explained[record.id] = (
            f"placed on {where} after putting {names} to sleep",
            {"slept": slept},
        )
        return decision

    def make_room_to_wake(self, record: DeploymentRecord) -> str | None:
        """For a sleeping copy whose budget does not fit back on its devices: make room
        there as for a placement, by the same rule (placement/residency.py, `room_to_wake`)
        — idle copies beside it that can sleep put to sleep first, else the cheapest set
        unloaded; never another copy of its own deployment. What was done, for its `woke`
        event (empty when the ledger already had room: the measured figures refused it);
        None when nothing makes room, or a race was lost (while a request waits, the loop
        tries the wake again each pass)."""
        warm, reconciler = self.lifetime.warm, self.reconciler
        deployed = {r.id: r for r in deployments.list_deployed(reconciler.db)}
        own = {i for i, r in deployed.items() if r.deployment_id == record.deployment_id}
        residues = {}
        if warm is not None and warm.enabled:
            residues = {
                i: residue_bytes(r)
                for i, r in deployed.items()
                if i not in own and warm.can_sleep(r)
            }
        priority = record.scaling.priority
        found = room_to_wake(
            ledger.current_state(reconciler.db),
            record.id,
            priority=priority,
            candidates=[c for c in self.candidates() if c.deployment not in own],
            residue_bytes=residues,
        )
        if found is None:
            return None
        reason = f"preempted by {record.model_name} (priority {priority})"
        if found.sleepers and warm is not None:  # sleepers come only with the tier on
            if not all(warm.sleep(deployed[c.deployment], reason=reason) for c in found.sleepers):
                return None
            return f"after putting {' and '.join(c.name for c in found.sleepers)} to sleep"
        if found.victims:
            if not all(reconciler.unload(v.deployment, reason=reason) for v in found.victims):
                return None
            return f"after unloading {victims_text(found.victims)}"
        return ""

    def _placed(self, record: DeploymentRecord, found: Preemption) -> None:
        victims = [
            {
                "deployment_id": v.deployment,
                "name": v.name,
                "priority": v.priority,
                "idle_s": round(v.idle_s, 1),
            }
            for v in found.victims
        ]
        data = {"unloaded": victims, "released_bytes": found.released_bytes}
        self.explained[record.id] = (found.explanation, data)

    def enqueue(self, record: DeploymentRecord, failure: DeploymentFailure) -> None:
        """A deployment that asked to wait and did not fit: QUEUED, its reason recorded
        (its position is shown by the next `serve_queue`)."""
        reconciler = self.reconciler
        message = f"queued: {failure.message}"
        if queue.enqueue(
            reconciler.db,
            record.id,
            owner=reconciler.owner,
            message=message,
            no_fit=failure.no_fit or {},
        ):
            data = {"priority": record.scaling.priority, "reason": failure.message}
            timeline.note(reconciler.db, record.id, EventKind.QUEUED, message, **data)

    def serve_queue(self) -> None:
        """Place what fits of the queue, a turn at a time (placement/turns.py decides); show
        each still waiting its position and why. A pass in which nothing a turn depends on
        has changed since the last one that placed nothing (`QueueView`) decides nothing."""
        reconciler = self.reconciler
        waiting = queue.waiting(reconciler.db)
        if not waiting:
            self._quiet = None
            return
        measurement = reconciler.measurement()
        state = ledger.current_state(reconciler.db).with_measurement(measurement)
        candidates = self.candidates()
        view = QueueView.of(waiting, state, candidates)
        if view == self._quiet:
            return
        records = {record.id: record for record in waiting}
        line = [self._in_line(record) for record in waiting]
        passed: list[Passed] = []
        turn = next_turn(line, state, candidates)
        self._quiet = view if turn.take is None else None
        while True:
            passed.extend(turn.passed)
            if turn.take is None:
                break
            line = line[len(turn.passed) + 1 :]
            taken = queue.take(
                reconciler.db, turn.take, owner=reconciler.owner, lease_s=reconciler.lease_s
            )
            if taken is not None:
                reconciler.place_taken(taken)
            state = ledger.current_state(reconciler.db).with_measurement(measurement)
            turn = next_turn(line, state, self.candidates())
        topology = state.fleet.topology.value
        for position, still in enumerate(passed, start=1):
            record = records[still.deployment]
            failure = with_copies(no_fit_failure(still.no_fit, topology), still.copies)
            message = queue_message(position, len(passed), failure.message)
            shown = record.no_fit or {}
            if record.last_error_message != message or shown.get("queue_position") != position:
                queue.show_position(
                    reconciler.db,
                    record.id,
                    position=position,
                    message=message,
                    no_fit=failure.no_fit or {},
                )

    def _in_line(self, record: DeploymentRecord) -> Waiting:
        """A queued deployment as its turn is decided: its request, and those of its copies
        waiting to be placed with it (none when its request can never be placed)."""
        reconciler = self.reconciler
        together = copies.waiting(reconciler.db, record.id) if record.copy_of is None else []
        try:
            requests = tuple(reconciler.wanted(r) for r in (record, *together))
        except InvalidInput:  # taking it ends it with why
            requests = ()
        return Waiting(deployment=record.id, priority=record.scaling.priority, requests=requests)
