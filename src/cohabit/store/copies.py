"""A deployment's copies as one: reserving several copies in one ledger transaction (all or
none), and ending every copy in one transaction (a stop). Copy 0 is the deployment's own row;
the others point at it (`copy_of`). Each status change is a guarded UPDATE, as in
deployments.py, so a copy is taken once, and ends (releasing its budget) exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update

from cohabit.placement.copies import CopiesNoFit, CopyPlacement, plan_copies
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import Measurement
from cohabit.store.database import Database, affected, utcnow
from cohabit.store.deployments import new_row, to_record
from cohabit.store.ledger import fleet_state, hold, release
from cohabit.store.records import ACTIVE, DeploymentRecord, DeploymentStatus
from cohabit.store.tables import DeploymentRow

_ACTIVE_VALUES = [status.value for status in ACTIVE]


def _of(deployment_id: str) -> ColumnElement[bool]:
    """The rows of a deployment's copies: its own (copy 0) and those pointing at it."""
    return or_(DeploymentRow.id == deployment_id, DeploymentRow.copy_of == deployment_id)


def add(db: Database, deployment_id: str) -> DeploymentRecord | None:
    """One more copy of a DEPLOYED deployment: a REQUESTED row like copy 0 (the same model,
    request, estimate, settings, scaling and end), numbered after its active copies. The
    reconciler places it on its own, spread from the others. None when copy 0 is not
    DEPLOYED any more."""
    with db.write() as session:
        first = session.get(DeploymentRow, deployment_id, with_for_update=True)
        if (
            first is None
            or first.status != DeploymentStatus.DEPLOYED.value
            or first.copy_of is not None
        ):
            return None
        record = to_record(first)
        indices = session.scalars(
            select(DeploymentRow.copy_index).where(
                _of(deployment_id), DeploymentRow.status.in_(_ACTIVE_VALUES)
            )
        ).all()
        new = record.decided()  # the copy is asked for as the deployment was
        row = new_row(
            new,
            utcnow(),
            status=DeploymentStatus.REQUESTED,
            copy_of=deployment_id,
            copy_index=max(indices) + 1,
        )
        row.ends_at = first.ends_at
        session.add(row)
        session.flush()
        return to_record(row)


def scalable(db: Database, *, owner: str) -> list[DeploymentRecord]:
    """This owner's DEPLOYED deployments (copy 0) that may run more than one copy."""
    query = (
        select(DeploymentRow)
        .where(DeploymentRow.status == DeploymentStatus.DEPLOYED.value)
        .where(DeploymentRow.claimed_by == owner)
        .where(DeploymentRow.copy_of.is_(None))
        .where(or_(DeploymentRow.max_copies > 1, DeploymentRow.min_copies > 1))
    )
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def waiting(db: Database, deployment_id: str) -> list[DeploymentRecord]:
    """The deployment's other copies still REQUESTED (placed with the copy being placed),
    by index."""
    query = (
        select(DeploymentRow)
        .where(DeploymentRow.copy_of == deployment_id)
        .where(DeploymentRow.status == DeploymentStatus.REQUESTED.value)
        .order_by(DeploymentRow.copy_index)
    )
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def reserve(
    db: Database,
    *,
    deployment_id: str,
    owner: str,
    requests: Sequence[PlacementRequest],
    lease_s: float,
    measurement: Measurement | None = None,
) -> list[CopyPlacement] | CopiesNoFit | None:
    """Place several copies of one deployment in one decision and hold every budget, or
    none, in one transaction under the ledger lock (placement/copies.py spreads them away
    from the slots the deployment's other copies hold). `requests` are named by the copies'
    row ids: the first is this owner's DEPLOYING copy; the others are REQUESTED copies that
    nobody drives, which this owner takes (DEPLOYING, under its lease) with their budgets.

    None when a copy is no longer where it should be (stopped, or taken by another
    reconciler): nothing is written then.
    """
    ids = [request.name for request in requests]
    now = utcnow()
    with db.write() as session:
        db.lock_ledger(session)
        rows = {
            row.id: row
            for row in session.scalars(
                select(DeploymentRow)
                .where(DeploymentRow.id.in_(ids))
                .order_by(DeploymentRow.copy_index)  # the order `end_all` locks them in
                .with_for_update()
            )
        }
        first = rows.get(ids[0])
        if (
            first is None
            or first.status != DeploymentStatus.DEPLOYING.value
            or first.claimed_by != owner
        ):
            return None
        for copy_id in ids[1:]:
            row = rows.get(copy_id)
            if (
                row is None
                or row.status != DeploymentStatus.REQUESTED.value
                or row.claimed_by is not None
            ):
                return None
        state = fleet_state(session).with_measurement(measurement)
        siblings = select(DeploymentRow.id).where(_of(deployment_id))
        mine = set(session.scalars(siblings)) - set(ids)
        held = [r.slot_key for r in state.reservations if r.deployment in mine]
        decision = plan_copies(state, requests, siblings=held)
        if isinstance(decision, CopiesNoFit):
            return decision
        until = now + timedelta(seconds=lease_s)
        for copy_id, placed in zip(ids, decision, strict=True):
            row = rows[copy_id]
            hold(session, row, placed.placement, state.fleet.topology)
            if copy_id != ids[0]:
                row.status = DeploymentStatus.DEPLOYING.value
                row.claimed_by = owner
                row.claimed_until = until
        return decision


def end_all(
    db: Database, deployment_id: str, *, values: Mapping[str, Any], others_only: bool = False
) -> list[DeploymentRecord]:
    """Write `values` (an ending: status, times, lease cleared) on every active copy of the
    deployment (`others_only`: but copy 0) and release their reservations, in one
    transaction. Returns the copies as they were before (by index; the caller stops their
    engines); empty when none was active."""
    ended: list[DeploymentRecord] = []
    which = DeploymentRow.copy_of == deployment_id if others_only else _of(deployment_id)
    with db.write() as session:
        rows = session.scalars(
            select(DeploymentRow)
            .where(which, DeploymentRow.status.in_(_ACTIVE_VALUES))
            .order_by(DeploymentRow.copy_index)
            .with_for_update()
        ).all()
        for row in rows:
            before = to_record(row)
            result = session.execute(
                update(DeploymentRow)
                .where(DeploymentRow.id == row.id)
                .where(DeploymentRow.status.in_(_ACTIVE_VALUES))
                .values(**values)
            )
            if affected(result) == 1:
                release(session, row.id)
                ended.append(before)
    return ended
