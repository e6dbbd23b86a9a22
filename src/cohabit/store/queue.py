"""The queue of deployments waiting for room (QUEUED): their order, taking one to place it,
and the position and reason each shows while it waits. Each status change is a guarded
UPDATE, as in deployments.py, so of several reconcilers exactly one takes a deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from cohabit.store.database import Database, affected, utcnow
from cohabit.store.deployments import to_record
from cohabit.store.records import NO_FIT_ERROR, DeploymentRecord
from cohabit.store.records import DeploymentStatus as S
from cohabit.store.tables import DeploymentRow


def waiting(db: Database) -> list[DeploymentRecord]:
    """QUEUED deployments in the order they get room: highest priority first, then the
    earliest requested."""
    query = (
        select(DeploymentRow)
        .where(DeploymentRow.status == S.QUEUED.value)
        .order_by(DeploymentRow.priority.desc(), DeploymentRow.requested_at, DeploymentRow.id)
    )
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def enqueue(
    db: Database, deployment_id: str, *, owner: str, message: str, no_fit: Mapping[str, Any]
) -> bool:
    """This owner's DEPLOYING deployment, which did not fit, to QUEUED: no driver, the NoFit
    recorded as why it waits. False when it is not there any more (stopped meanwhile)."""
    values: dict[str, Any] = {
        "status": S.QUEUED.value,
        "claimed_by": None,
        "claimed_until": None,
        "last_error_code": NO_FIT_ERROR,
        "last_error_message": message,
        "last_error_at": utcnow(),
        "no_fit": dict(no_fit),
    }
    with db.write() as session:
        result = session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.status == S.DEPLOYING.value)
            .where(DeploymentRow.claimed_by == owner)
            .values(**values)
        )
        return affected(result) == 1


def take(
    db: Database, deployment_id: str, *, owner: str, lease_s: float
) -> DeploymentRecord | None:
    """QUEUED → DEPLOYING, claimed by `owner`, to be placed now; the record, or None when
    another process took it first (or it was stopped)."""
    with db.write() as session:
        result = session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.status == S.QUEUED.value)
            .values(
                status=S.DEPLOYING.value,
                claimed_by=owner,
                claimed_until=utcnow() + timedelta(seconds=lease_s),
            )
        )
        if affected(result) != 1:
            return None
        row = session.get(DeploymentRow, deployment_id)
        return None if row is None else to_record(row)


def show_position(
    db: Database, deployment_id: str, *, position: int, message: str, no_fit: Mapping[str, Any]
) -> None:
    """What a waiting deployment shows: its place in the queue and why it waits."""
    with db.write() as session:
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.status == S.QUEUED.value)
            .values(
                last_error_code=NO_FIT_ERROR,
                last_error_message=message,
                no_fit={**no_fit, "queue_position": position},
            )
        )
