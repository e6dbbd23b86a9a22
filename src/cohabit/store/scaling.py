"""Scaling a deployment to zero and back, and the facts that drive it: `unload` (engine
stopped by the caller, budget released here), `load` (back to REQUESTED for the reconciler),
when each deployment was last used, and which deployments are due to unload or to end.
Each status change is a guarded UPDATE, as in deployments.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, update

from cohabit.placement.decision import PlacementFields
from cohabit.store.database import Database, affected
from cohabit.store.deployments import error_values, release_as, to_record
from cohabit.store.records import (
    ACTIVE,
    DeploymentFailure,
    DeploymentRecord,
    DeploymentStatus,
)
from cohabit.store.tables import DeploymentRow

_ACTIVE_VALUES = [status.value for status in ACTIVE]

# Where a placed deployment ran (the record's placement fields) and its engine; an unloaded
# one holds neither (it is placed again on load).
_PLACEMENT_COLUMNS = (*(field.name for field in fields(PlacementFields)), "engine_handle")


def unload(
    db: Database,
    deployment_id: str,
    *,
    allowed: Iterable[DeploymentStatus] = (DeploymentStatus.DEPLOYED,),
    owner: str | None = None,
    failure: DeploymentFailure | None = None,
) -> DeploymentRecord | None:
    """Scale a deployment to zero: from one of `allowed` to UNLOADED, its reservations
    released, its placement, engine handle and lease cleared, in one transaction (still
    listed and routable; `load` brings it back). `failure` records why when it is a load
    that found no room. Returns the record as it was before (the caller stops its engine),
    or None when it was not in `allowed` (or, with `owner`, not this owner's)."""
    values: dict[str, Any] = {
        "status": DeploymentStatus.UNLOADED.value,
        "claimed_by": None,
        "claimed_until": None,
    } | dict.fromkeys(_PLACEMENT_COLUMNS)
    if failure is not None:
        values |= error_values(failure)
    return release_as(db, deployment_id, allowed=allowed, values=values, owner=owner)


def load(db: Database, deployment_id: str) -> bool:
    """UNLOADED → REQUESTED with no driver, so the next reconciler pass claims, places and
    starts it. One guarded UPDATE: of concurrent callers exactly one gets True."""
    with db.write() as session:
        result = session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.status == DeploymentStatus.UNLOADED.value)
            .values(
                status=DeploymentStatus.REQUESTED.value,
                claimed_by=None,
                claimed_until=None,
            )
        )
        return affected(result) == 1


def scaling_to_zero(db: Database, *, owner: str) -> list[DeploymentRecord]:
    """This owner's DEPLOYED deployments that may be unloaded when idle (min_copies 0 and a
    keep-alive other than never); copy 0 of each (unloading it unloads the others)."""
    query = (
        select(DeploymentRow)
        .where(DeploymentRow.status == DeploymentStatus.DEPLOYED.value)
        .where(DeploymentRow.claimed_by == owner)
        .where(DeploymentRow.min_copies == 0)
        .where(DeploymentRow.keep_alive_s >= 0)
        .where(DeploymentRow.copy_of.is_(None))  # a deployment unloads with all its copies
    )
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def past_their_end(db: Database, moment: datetime) -> list[DeploymentRecord]:
    """Active deployments whose duration ended before `moment` (whoever drives them)."""
    query = (
        select(DeploymentRow)
        .where(DeploymentRow.status.in_(_ACTIVE_VALUES))
        .where(DeploymentRow.ends_at <= moment)
        .order_by(DeploymentRow.requested_at)
    )
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def note_use(db: Database, last_used: Mapping[str, datetime]) -> None:
    """Record when each of these deployments (and their copies: traffic is counted under
    the deployment's id) was last used, where that is later than what is recorded (several
    servers each flush what they saw; the latest wins)."""
    if not last_used:
        return
    with db.write() as session:
        for deployment_id, moment in last_used.items():
            session.execute(
                update(DeploymentRow)
                .where(
                    or_(DeploymentRow.id == deployment_id, DeploymentRow.copy_of == deployment_id)
                )
                .where(DeploymentRow.status.in_(_ACTIVE_VALUES))
                .where(
                    or_(DeploymentRow.last_used_at.is_(None), DeploymentRow.last_used_at < moment)
                )
                .values(last_used_at=moment)
            )
