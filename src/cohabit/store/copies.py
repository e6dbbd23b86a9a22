"""A deployment's copies as one: ending every copy in one transaction (a stop). Copy 0 is the
deployment's own row; the others point at it (`copy_of`). Each status change is a guarded
UPDATE, as in deployments.py, so a copy ends (and releases its budget) exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import or_, select, update

from cohabit.store.database import Database, affected
from cohabit.store.deployments import to_record
from cohabit.store.ledger import release
from cohabit.store.records import ACTIVE, DeploymentRecord
from cohabit.store.tables import DeploymentRow

_ACTIVE_VALUES = [status.value for status in ACTIVE]


def end_all(
    db: Database, deployment_id: str, *, values: Mapping[str, Any]
) -> list[DeploymentRecord]:
    """Write `values` (an ending: status, times, lease cleared) on every active copy of the
    deployment and release their reservations, in one transaction. Returns the copies as
    they were before (copy 0 first; the caller stops their engines); empty when none was
    active."""
    mine = or_(DeploymentRow.id == deployment_id, DeploymentRow.copy_of == deployment_id)
    ended: list[DeploymentRecord] = []
    with db.write() as session:
        rows = session.scalars(
            select(DeploymentRow)
            .where(mine, DeploymentRow.status.in_(_ACTIVE_VALUES))
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
