"""Deployment events: the timeline of what happened to each deployment and why, in the order
it happened. Whoever moves a deployment records the step (`record`); readers page through a
deployment's events by id (`since`), which is also the cursor a follower resumes from, or
read its last few (`latest`). A deployment's events are deleted with its record
(store.deployments.delete_ended).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from cohabit.store.database import Database, aware, utcnow
from cohabit.store.tables import EventRow

log = logging.getLogger(__name__)

MESSAGE_CHARS = 2_000  # an engine's error line can be long; the timeline keeps the start
PAGE = 500


class EventKind(StrEnum):
    """What happened. Values are lower-case words, as the API and `cohabit events` show them."""

    REQUESTED = "requested"  # admitted (the request and what it was sized at)
    QUEUED = "queued"  # no room now; waiting in the queue (position, reason)
    PLACED = "placed"  # a device chosen, with the planner's explanation
    RESERVED = "reserved"  # the budget held (bytes per device)
    NO_FIT = "no_fit"  # no placement (the NoFit reason)
    STARTED = "started"  # the engine's process launched (pid)
    ENGINE_IMPORTED = "engine_imported"  # its log shows its code imported, the model opened
    WEIGHTS_LOADED = "weights_loaded"  # its log shows its weights loaded
    HEALTHY = "healthy"  # the engine answers; serving
    FIRST_TOKEN = "first_token"  # the first answer to a request held for the load began
    OVER_BUDGET = "over_budget"  # measured memory above the budget (+ tolerance)
    SCALED = "scaled"  # copies added or removed, with the reason
    RESTARTED = "restarted"  # a copy's engine failed while another served; started again
    UNLOADED = "unloaded"  # engine stopped and budget released while idle (or preempted)
    SLEPT = "slept"  # engine asleep while idle, its budget but the residue handed back
    WOKE = "woke"  # a request woke a sleeping engine, its budget taken back
    LOADING = "loading"  # a request woke an unloaded deployment
    FAILED = "failed"  # ended with an error code
    STOPPED = "stopped"  # stopped (by a user, its duration, or a policy)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    id: int
    deployment_id: str
    at: datetime
    kind: str
    message: str
    data: Mapping[str, Any] | None


def record(
    db: Database,
    deployment_id: str,
    kind: EventKind,
    message: str,
    data: Mapping[str, Any] | None = None,
) -> EventRecord:
    """Append one event to a deployment's timeline (its own short write transaction)."""
    with db.write() as session:
        row = EventRow(
            deployment_id=deployment_id,
            at=utcnow(),
            kind=kind.value,
            message=message[:MESSAGE_CHARS],
            data=None if data is None else dict(data),
        )
        session.add(row)
        session.flush()
        return _record(row)


Step = tuple[EventKind, str, Mapping[str, Any] | None]  # kind, message, data


def record_steps(db: Database, deployment_id: str, steps: Sequence[Step]) -> None:
    """Append several events at once, in order, in one write transaction (steps that happen
    together: one write instead of several on a busy database)."""
    with db.write() as session:
        add_steps(session, deployment_id, steps)


def add_steps_or_log(session: Session, deployment_id: str, steps: Sequence[Step]) -> None:
    """Append events inside the caller's transaction, so they commit with the step they
    describe (admission's `requested` with the deployment's row: no reconciler can write
    `placed` first). Under a savepoint: a fault writing them is logged and the caller's
    step still commits, without its events."""
    try:
        with session.begin_nested():
            add_steps(session, deployment_id, steps)
    except Exception:
        kinds = ", ".join(kind.value for kind, _message, _data in steps)
        log.exception("recording the %s event of deployment %s failed", kinds, deployment_id)


def add_steps(session: Session, deployment_id: str, steps: Sequence[Step]) -> None:
    """Append events inside the caller's transaction."""
    if not steps:
        return
    at = utcnow()
    rows = [
        {"deployment_id": deployment_id, "at": at, "kind": kind.value,
         "message": message[:MESSAGE_CHARS], "data": None if data is None else dict(data)}
        for kind, message, data in steps
    ]  # fmt: skip
    session.execute(insert(EventRow), rows)


def since(
    db: Database, deployment_id: str, *, after: int = 0, limit: int = PAGE
) -> list[EventRecord]:
    """The deployment's events with an id above `after`, oldest first, at most `limit`."""
    with db.read() as session:
        rows = session.scalars(
            select(EventRow)
            .where(EventRow.deployment_id == deployment_id, EventRow.id > after)
            .order_by(EventRow.id)
            .limit(limit)
        ).all()
        return [_record(row) for row in rows]


def latest(db: Database, deployment_id: str, *, limit: int = PAGE) -> list[EventRecord]:
    """The deployment's last `limit` events, oldest first (what a page shows of a long
    timeline)."""
    with db.read() as session:
        rows = session.scalars(
            select(EventRow)
            .where(EventRow.deployment_id == deployment_id)
            .order_by(EventRow.id.desc())
            .limit(limit)
        ).all()
        return [_record(row) for row in reversed(rows)]


def _record(row: EventRow) -> EventRecord:
    return EventRecord(
        id=row.id,
        deployment_id=row.deployment_id,
        at=aware(row.at) or row.at,
        kind=row.kind,
        message=row.message,
        data=row.data,
    )
