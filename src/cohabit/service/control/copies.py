"""The copies of a deployment, as the reconciler drives them (docs/copies.md).

A deployment of several copies is placed in one decision: when the reconciler places copy 0,
every copy still REQUESTED is planned with it, spread across nodes and devices, and all their
budgets are reserved in one ledger transaction or none (store/copies.py). Each copy then runs
its own engine, keyed by its row's id, and is driven like any deployment.

A copy whose engine fails while another copy serves does not end the deployment: it starts
again inside the budget it holds (a `restarted` event with the failure code). Copy 0's row
is the deployment's, so it stays DEPLOYED meanwhile, with no engine handle (nothing routes
to it) until its engine is ready again. When no other copy serves, or a copy keeps failing
at start-up, the failure ends the deployment as for a single engine: every copy ends with it.

Unloading (scale to zero, preemption) unloads copy 0 and stops the other copies; a copy
other than 0 chosen by preemption is stopped alone (the deployment keeps serving).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from cohabit.placement.copies import CopiesNoFit, CopyPlacement
from cohabit.placement.decision import Placement
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.runtime.interface import EngineHandle
from cohabit.service.control import timeline
from cohabit.service.control.driver import stop_ended
from cohabit.store import copies, deployments, ledger, scaling
from cohabit.store.database import Database
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentFailure, DeploymentRecord, DeploymentStatus

if TYPE_CHECKING:
    from cohabit.service.control.driver import Driver

log = logging.getLogger(__name__)

# Starts of a failed copy in a row that did not reach serving before its failure stands.
MAX_RESTARTS = 3


def has_copies(record: DeploymentRecord) -> bool:
    """Whether the record is one copy of a deployment that may run several."""
    return (
        record.copy_of is not None
        or record.scaling.starting_copies > 1
        or (record.scaling.max_copies or 0) > 1
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyFailure:
    """What the loop knows when a copy's engine failed."""

    has_copies: bool  # the deployment may run several copies
    another_serves: bool  # another copy of it is DEPLOYED with an engine
    failed_starts: int  # starts of this copy that failed since it last served
    budget_held: bool  # its reservation is still there to start in


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart:
    failed_starts: int  # what to remember: this start counted as failed until it serves


def restart_after_failure(seen: CopyFailure) -> Restart | None:
    """Start the copy again inside its budget while another copy serves, at most
    `MAX_RESTARTS` times in a row without serving; None when the failure stands (it ends
    the copy, and with copy 0 the deployment)."""
    if not seen.has_copies or not seen.another_serves or not seen.budget_held:
        return None
    if seen.failed_starts >= MAX_RESTARTS:
        return None
    return Restart(failed_starts=seen.failed_starts + 1)


def with_copies(failure: DeploymentFailure, group: CopiesNoFit | None) -> DeploymentFailure:
    """A NoFit's failure, saying how many of the copies planned together (`group`) fit."""
    if group is None:
        return failure
    body = dict(failure.no_fit or {}) | {"copies_wanted": group.wanted, "copies_fit": group.fit}
    body["message"] = group.message
    message = f"{group.no_fit.reason.value}: {group.message}"
    return replace(failure, message=message, no_fit=body)


class CopyDriver:
    """The copies' part of one reconciler (whose pass lock it runs under)."""

    def __init__(self, reconciler: Driver) -> None:
        self.reconciler = reconciler
        self._no_fit: dict[str, CopiesNoFit] = {}  # copy 0's id: how many copies fit
        self.explained: dict[str, tuple[str, dict[str, Any]]] = {}  # for `placed`
        self._failed_starts: dict[str, int] = {}  # restarts without serving, per copy
        self.restarting: set[str] = set()  # copies 0 restarting while DEPLOYED

    @property
    def db(self) -> Database:
        return self.reconciler.db

    # --- placing ------------------------------------------------------------------------

    def reserve(
        self, record: DeploymentRecord, wanted: PlacementRequest
    ) -> Placement | NoFit | None:
        """Reserve this copy, with the deployment's other copies still REQUESTED when it is
        copy 0, in one decision, spread from the copies already placed; start the others'
        engines. The record's placement, the NoFit of the copy that did not fit, or None
        when it is no longer this reconciler's to place."""
        reconciler = self.reconciler
        waiting = copies.waiting(self.db, record.id) if record.copy_of is None else []
        requests = [wanted, *(reconciler.wanted(copy) for copy in waiting)]
        decision = copies.reserve(
            self.db,
            deployment_id=record.deployment_id,
            owner=reconciler.owner,
            requests=requests,
            lease_s=reconciler.lease_s,
            measurement=reconciler.measurement(),
        )
        if decision is None:
            return None
        if isinstance(decision, CopiesNoFit):
            if len(requests) > 1:
                self._no_fit[record.id] = decision
            return decision.no_fit
        self.explained[record.id] = self._explanation(record, decision)
        for copy, placed in zip(waiting, decision[1:], strict=True):
            explained = self._explanation(copy, [placed])
            timeline.placed(self.db, copy.id, placed.placement, preemption=explained)
            reconciler.launch(copy, placed.placement, allowed=(DeploymentStatus.DEPLOYING,))
        return decision[0].placement

    def _explanation(
        self, record: DeploymentRecord, placed: Sequence[CopyPlacement]
    ) -> tuple[str, dict[str, Any]]:
        """ "copy 0 on node-a gpu 0, a node no other copy holds; copy 1 on node-a gpu 1, …" """
        indices = range(record.copy_index, record.copy_index + len(placed))
        text = "; ".join(f"copy {i} {p.explanation}" for i, p in zip(indices, placed, strict=True))
        data = {
            "copies": [
                {"copy_index": i, "spread": p.spread.value, "why": p.explanation}
                for i, p in zip(indices, placed, strict=True)
            ]
        }
        return text, data

    def grouped(self, record: DeploymentRecord) -> bool:
        """Whether the record's last reservation planned several copies at once (then
        preemption is not tried: it makes room for one copy)."""
        return record.id in self._no_fit

    def failure(self, record: DeploymentRecord, failure: DeploymentFailure) -> DeploymentFailure:
        """A NoFit's failure, saying how many of the copies fit when several were placed."""
        return with_copies(failure, self._no_fit.pop(record.id, None))

    # --- failing ------------------------------------------------------------------------

    def survive(self, copy_id: str, handle: EngineHandle, failure: DeploymentFailure) -> bool:
        """A copy's engine failed: start it again inside its budget when another copy of the
        deployment serves (True); False when the failure stands (the caller ends it)."""
        reconciler = self.reconciler
        record = deployments.get(self.db, copy_id)
        copied = has_copies(record)
        another = copied and self._another_serves(record)
        placement = None
        if another:
            placement = ledger.held_placement(self.db, copy_id, reconciler.wanted(record))
        seen = CopyFailure(
            has_copies=copied,
            another_serves=another,
            failed_starts=self._failed_starts.get(copy_id, 0),
            budget_held=placement is not None,
        )
        restart = restart_after_failure(seen)
        if restart is None or placement is None:
            self._failed_starts.pop(copy_id, None)
            return False
        self._failed_starts[copy_id] = restart.failed_starts
        reconciler.stop_engine(handle)
        values = deployments.error_values(failure) | {"engine_handle": None}
        if record.copy_of is None:  # the deployment's own row: it keeps serving
            self.restarting.add(copy_id)
            moved = reconciler.advance(
                copy_id, (DeploymentStatus.DEPLOYED,), DeploymentStatus.DEPLOYED, values
            )
        else:
            moved = reconciler.advance(
                copy_id,
                (DeploymentStatus.DEPLOYED, DeploymentStatus.INITIALIZING),
                DeploymentStatus.INITIALIZING,
                values,
            )
        if not moved:
            self.restarting.discard(copy_id)
            return True  # stopped or taken meanwhile: nothing to restart
        message = (
            f"copy {record.copy_index} failed ({failure.code}: {failure.message}); "
            "starting it again in its budget while another copy serves"
        )
        data = {"copy_id": copy_id, "copy_index": record.copy_index, "code": failure.code}
        timeline.note(self.db, record.deployment_id, EventKind.RESTARTED, message, **data)
        if record.copy_of is not None:
            timeline.note(self.db, copy_id, EventKind.RESTARTED, message, **data)
        if record.copy_of is None:
            reconciler.launch(
                record,
                placement,
                allowed=(DeploymentStatus.DEPLOYED,),
                to=DeploymentStatus.DEPLOYED,
            )
        else:
            reconciler.launch(record, placement, allowed=(DeploymentStatus.INITIALIZING,))
        return True

    def resume_restart(self, record: DeploymentRecord) -> bool:
        """A copy 0 taken over while it was starting again (DEPLOYED with no engine handle):
        its engine is started afresh here, since the handle that would route to it was never
        written. True when it was such a copy and is on its way."""
        if record.copy_of is not None or record.engine_handle is not None:
            return False
        if record.status is not DeploymentStatus.DEPLOYED or not has_copies(record):
            return False
        reconciler = self.reconciler
        placement = ledger.held_placement(self.db, record.id, reconciler.wanted(record))
        if placement is None:
            return False
        reconciler.stop_engine(EngineHandle(deployment_id=record.id))
        self.restarting.add(record.id)
        reconciler.launch(
            record, placement, allowed=(DeploymentStatus.DEPLOYED,), to=DeploymentStatus.DEPLOYED
        )
        return True

    def _another_serves(self, record: DeploymentRecord) -> bool:
        return any(
            other.id != record.id
            and other.status is DeploymentStatus.DEPLOYED
            and other.engine_handle is not None
            for other in deployments.copies_of(self.db, record.deployment_id)
        )

    def serving_again(self, copy_id: str) -> None:
        """A copy's engine is ready: its failed starts are forgotten."""
        self._failed_starts.pop(copy_id, None)
        self.restarting.discard(copy_id)

    def end_others(self, ended: DeploymentRecord, values: dict[str, Any]) -> None:
        """A copy's failure has ended its row. A copy other than 0 while another copy serves
        ends alone (the deployment's timeline says so); otherwise the deployment fails: every
        other active copy ends the same way (their budgets released in one transaction) and
        their engines stop."""
        if not has_copies(ended):
            return
        if ended.copy_of is not None and self._another_serves(ended):
            message = f"copy {ended.copy_index} ended ({values.get('last_error_code')}): " + str(
                values.get("last_error_message")
            )
            data = {"copy_id": ended.id, "copy_index": ended.copy_index}
            timeline.note(self.db, ended.deployment_id, EventKind.SCALED, message, **data)
            return
        others = copies.end_all(self.db, ended.deployment_id, values=values)
        self._stop(others, EventKind.STOPPED, "stopped: another copy of its deployment failed")

    def _stop(self, records: Sequence[DeploymentRecord], kind: EventKind, message: str) -> None:
        for before in records:
            stop_ended(self.reconciler, before, kind, message)

    # --- unloading ----------------------------------------------------------------------

    def unload(self, deployment_id: str, *, reason: str) -> bool:
        """Unload a DEPLOYED copy and stop its engine: copy 0 UNLOADED (an `unloaded` event)
        with every other copy stopped, or a copy other than 0 stopped alone (the deployment
        serves on). False when it was not DEPLOYED, or its deployment is busy."""
        gone = self._unload(deployment_id)
        for before in gone:
            unloaded = before.id == deployment_id and before.copy_of is None
            kind = EventKind.UNLOADED if unloaded else EventKind.STOPPED
            text = f"{kind.value}: {reason}"
            stop_ended(self.reconciler, before, kind, text, reason=reason)
        return bool(gone)

    def _unload(self, deployment_id: str) -> list[DeploymentRecord]:
        record = deployments.get(self.db, deployment_id)
        if record.copy_of is not None:
            if self.reconciler.activity.in_flight(record.deployment_id) > 0:
                return []  # its deployment is busy: no copy of it is idle
            before = deployments.release_as(
                self.db,
                deployment_id,
                allowed=(DeploymentStatus.DEPLOYED,),
                values=deployments.stop_values(),
            )
            return [] if before is None else [before]
        unloaded = scaling.unload(self.db, deployment_id)
        if unloaded is None:
            return []
        if not has_copies(record):
            return [unloaded]
        others = copies.end_all(
            self.db, deployment_id, values=deployments.stop_values(), others_only=True
        )
        return [unloaded, *others]
