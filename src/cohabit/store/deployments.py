"""Deployment rows: admission inserts them, the reconciler claims and moves them, stop and
failure end them. Every status change is a guarded UPDATE (`WHERE status IN …`), so a change
happens once however many threads or processes race for it; ending a deployment releases its
reservations in the same transaction, so budgets are released exactly once.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Select,
    bindparam,
    delete,
    func,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from cohabit.placement.decision import PlacementFields
from cohabit.store.database import Database, affected, aware, utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.events import Step, add_steps_or_log
from cohabit.store.ledger import release
from cohabit.store.records import (
    ACTIVE,
    DRIVEN,
    DeploymentFailure,
    DeploymentRecord,
    DeploymentStatus,
    NewDeployment,
    Scaling,
)
from cohabit.store.tables import OWNER_CHARS, DeploymentRow, EventRow, ModelRow, ReservationRow

_HOST_CHARS = 40  # of a lease owner's id; the rest holds ":<pid>:<nonce>"

_ACTIVE_VALUES = tuple(sorted(status.value for status in ACTIVE))
# The statuses as SQL literals: a planner that sees the values knows from its statistics how
# few records are active and looks them up by the status index (a bound list reads as "most
# of the table" to SQLite), and the statement text never changes, so SQLAlchemy compiles it
# once instead of expanding a list into it on every execution.
_ACTIVE_LITERALS: tuple[ColumnElement[str], ...] = tuple(
    literal_column(f"'{value}'") for value in _ACTIVE_VALUES
)


def _active() -> ColumnElement[bool]:
    """`status IN (the active statuses)`, the values written into the SQL."""
    return DeploymentRow.__table__.c.status.in_(_ACTIVE_LITERALS)


def _ended() -> ColumnElement[bool]:
    return DeploymentRow.__table__.c.status.not_in(_ACTIVE_LITERALS)


def _deployment() -> ColumnElement[bool]:
    """A deployment's own row (copy 0), not one of its other copies: what users list."""
    return DeploymentRow.__table__.c.copy_of.is_(None)


# What the lease writes set besides the lease: the row's revision as it was. The lease moves
# every reconciler tick and says nothing about the deployment, so it leaves kept renderings
# of the record valid; every other write bumps the revision (tables.DeploymentRow).
_SAME_REVISION = {"revision": DeploymentRow.revision}


def create(db: Database, new: NewDeployment, *, steps: Sequence[Step] = ()) -> DeploymentRecord:
    """Insert it REQUESTED, or UNLOADED when it starts with no copy (loaded on demand), with
    its `starting_copies` - 1 other copies (REQUESTED, `copy_of` its id) and the first events
    of its timeline (`steps`), in one transaction: no reconciler can place it, and write
    `placed`, before its `requested` is there. Returns copy 0, the deployment itself.
    Raises RecordNotFound when its model was deleted since the caller read it."""
    scaling = new.scaling
    now = utcnow()
    status = DeploymentStatus.REQUESTED if scaling.starting_copies else DeploymentStatus.UNLOADED
    try:
        with db.write() as session:
            rows = [
                new_row(new, now, status=status),
                *(
                    new_row(new, now, status=status, copy_of=new.id, copy_index=index)
                    for index in range(1, scaling.starting_copies)
                ),
            ]
            session.add(rows[0])
            session.flush()  # copy 0 first: the others point at it
            session.add_all(rows[1:])
            session.flush()
            if steps:
                add_steps_or_log(session, new.id, steps)
            return to_record(rows[0])
    except IntegrityError:
        # The model's foreign key: it went between admission's read and this insert.
        with db.read() as session:
            if session.get(ModelRow, new.model_id) is None:
                raise RecordNotFound("model", new.model_id) from None
        raise


def new_row(
    new: NewDeployment,
    now: datetime,
    *,
    status: DeploymentStatus,
    copy_of: str | None = None,
    copy_index: int = 0,
) -> DeploymentRow:
    """A row for copy `copy_index` of a new deployment (copy 0 takes the deployment's id)."""
    scaling = new.scaling
    return DeploymentRow(
        id=new.id if copy_of is None else str(uuid.uuid4()),
        model_id=new.model_id,
        config_id=new.config_id,
        file_id=new.file_id,
        model_name=new.model_name,
        engine=new.engine,
        status=status.value,
        request=dict(new.request),
        model_path=new.model_path,
        requested_bytes=new.requested_bytes,
        tensor_parallel=new.tensor_parallel,
        max_model_len=new.max_model_len,
        estimate=None if new.estimate is None else dict(new.estimate),
        engine_settings=dict(new.engine_settings),
        requested_at=now,
        priority=scaling.priority,
        keep_alive_s=scaling.keep_alive_s,
        queue=scaling.queue,
        min_copies=scaling.min_copies,
        starting_copies=scaling.starting_copies,
        max_copies=scaling.max_copies,
        duration_min=scaling.duration_min,
        ends_at=(
            None if scaling.duration_min is None else now + timedelta(minutes=scaling.duration_min)
        ),
        copy_of=copy_of,
        copy_index=copy_index,
    )


def get(db: Database, deployment_id: str) -> DeploymentRecord:
    with db.read() as session:
        row = session.get(DeploymentRow, deployment_id)
        if row is None:
            raise RecordNotFound("deployment", deployment_id)
        return to_record(row)


def list_all(
    db: Database, *, model_id: str | None = None, copies: bool = False
) -> list[DeploymentRecord]:
    """Every deployment, oldest request first; with `copies`, every copy's row too."""
    query = select(DeploymentRow).order_by(DeploymentRow.requested_at, DeploymentRow.id)
    if not copies:
        query = query.where(_deployment())
    if model_id is not None:
        query = query.where(DeploymentRow.model_id == model_id)
    with db.read() as session:
        return [to_record(row) for row in session.scalars(query)]


def owner_id(host: str, pid: int, nonce: str) -> str:
    """A lease owner's id, `host:pid:nonce`, that fits the claimed_by column whatever the host
    name: a longer host name (a Kubernetes pod's reaches 63) keeps its first 31 characters and
    gains 8 hex digits of its SHA-256, so two long names that share a prefix stay apart.

    >>> owner_id("gpu-box", 4242, "9f1c2b3a")
    'gpu-box:4242:9f1c2b3a'
    >>> owner_id("inference-" + "x" * 51, 7, "9f1c2b3a")
    'inference-xxxxxxxxxxxxxxxxxxxxx~d363c24d:7:9f1c2b3a'
    """
    if len(host) > _HOST_CHARS:
        digest = hashlib.sha256(host.encode("utf-8", "surrogateescape")).hexdigest()[:8]
        host = f"{host[: _HOST_CHARS - 9]}~{digest}"
    owner = f"{host}:{pid}:{nonce}"
    if len(owner) > OWNER_CHARS:
        raise ValueError(f"lease owner {owner!r} is longer than {OWNER_CHARS} characters")
    return owner


class PageEntry(NamedTuple):
    """One deployment of a page as `page_revisions` reads it."""

    id: str
    revision: int
    copied: bool  # it may have other copies (more than one starting, or up to, copy)


def page(
    db: Database, *, limit: int, offset: int = 0, model_id: str | None = None
) -> list[DeploymentRecord]:
    """One page of the deployments, in the order the API lists them: the active ones first
    (oldest request first), then the ended ones, newest first; `offset` and `limit` count
    in that order. Both parts are index reads (the active ones; request time), so a page
    costs the same whether thousands of ended records lie behind it or none."""
    with db.read() as session:
        ids = [row[0] for row in _paged(session, _ID_PAGE, limit, offset, model_id)]
        rows = {
            row.id: row
            for row in session.scalars(select(DeploymentRow).where(DeploymentRow.id.in_(ids)))
        }
        return [to_record(rows[i]) for i in ids if i in rows]


def page_revisions(
    db: Database, *, limit: int, offset: int = 0, model_id: str | None = None
) -> list[PageEntry]:
    """The page `page()` reads, as (id, revision, copied) entries, so that a caller can reuse
    what it made of a record it has seen while the revision is the same: every write to a
    record but its lease's bumps it. A copy's writes bump the copy's own revision
    (`copy_revisions` reads those of the `copied` ones)."""
    with db.read() as session:
        return [
            PageEntry(row[0], row[1], bool(row[2]))
            for row in _paged(session, _REVISION_PAGE, limit, offset, model_id)
        ]


def with_revisions(
    db: Database, deployment_ids: Iterable[str]
) -> list[tuple[DeploymentRecord, int]]:
    """The records of these ids that exist, each with its revision (read together, so the
    two always agree), in no particular order."""
    ids = list(deployment_ids)
    if not ids:
        return []
    with db.read() as session:
        rows = session.scalars(select(DeploymentRow).where(DeploymentRow.id.in_(ids)))
        return [(to_record(row), row.revision) for row in rows]


# Built once (each page asks): SQLAlchemy then compiles them once per database kind.
_COPY_REVISIONS = (
    select(DeploymentRow.copy_of, DeploymentRow.id, DeploymentRow.revision)
    .where(DeploymentRow.copy_of.in_(bindparam("ids", expanding=True)))
    .where(_active())
    .order_by(DeploymentRow.copy_of, DeploymentRow.copy_index)
)
_ACTIVE_COPIES = (
    select(DeploymentRow)
    .where(DeploymentRow.copy_of.in_(bindparam("ids", expanding=True)))
    .where(_active())
    .order_by(DeploymentRow.copy_index)
)


def copy_revisions(
    db: Database, deployment_ids: Iterable[str]
) -> dict[str, tuple[tuple[str, int], ...]]:
    """The (id, revision) of the active copies (beyond copy 0) of these deployments, under
    each deployment's id by copy index: what tells a page its deployments' copies changed.
    One read by the copy index, of three columns."""
    ids = list(deployment_ids)
    if not ids:
        return {}
    found: dict[str, list[tuple[str, int]]] = {}
    with db.read() as session:
        for copy_of, copy_id, revision in session.execute(_COPY_REVISIONS, {"ids": ids}):
            found.setdefault(str(copy_of), []).append((copy_id, revision))
    return {deployment_id: tuple(pairs) for deployment_id, pairs in found.items()}


def active_copies(
    db: Database, deployment_ids: Iterable[str]
) -> dict[str, list[tuple[DeploymentRecord, int]]]:
    """The active copies (beyond copy 0) of these deployments, under each deployment's id
    by copy index, each with its revision: what a page shows of a deployment's copies."""
    ids = list(deployment_ids)
    if not ids:
        return {}
    found: dict[str, list[tuple[DeploymentRecord, int]]] = {}
    with db.read() as session:
        for row in session.scalars(_ACTIVE_COPIES, {"ids": ids}):
            record = to_record(row)
            found.setdefault(record.deployment_id, []).append((record, row.revision))
    return found


@dataclass(frozen=True, kw_only=True)
class _PageQueries:
    """The statements of one kind of page read, built once (SQLAlchemy then compiles each
    once per database kind and reuses it): the active rows in order, how many are active,
    and the ended rows newest first; `scoped_*` add `model_id = :model_id`."""

    active: Select[Any]
    count: Select[Any]
    ended: Select[Any]
    scoped_active: Select[Any]
    scoped_count: Select[Any]
    scoped_ended: Select[Any]

    @classmethod
    def of(cls, columns: Sequence[Any]) -> _PageQueries:
        c = DeploymentRow.__table__.c
        active = (
            select(*columns)
            .where(_active())
            .where(_deployment())
            .order_by(c.requested_at, c.id)
            .limit(bindparam("limit"))
            .offset(bindparam("offset"))
        )
        count = (
            select(func.count())
            .select_from(DeploymentRow.__table__)
            .where(_active())
            .where(_deployment())
        )
        ended = (
            select(*columns)
            .where(_ended())
            .where(_deployment())
            .order_by(c.requested_at.desc(), c.id.desc())
            .limit(bindparam("limit"))
            .offset(bindparam("offset"))
        )
        mine = c.model_id == bindparam("model_id")
        return cls(
            active=active,
            count=count,
            ended=ended,
            scoped_active=active.where(mine),
            scoped_count=count.where(mine),
            scoped_ended=ended.where(mine),
        )


_ID_PAGE = _PageQueries.of([DeploymentRow.__table__.c.id])
_C = DeploymentRow.__table__.c
_REVISION_PAGE = _PageQueries.of(
    [
        _C.id,
        _C.revision,
        or_(_C.starting_copies > 1, func.coalesce(_C.max_copies, 1) > 1).label("copied"),
    ]
)


def _paged(
    session: Session, queries: _PageQueries, limit: int, offset: int, model_id: str | None
) -> list[tuple[Any, ...]]:
    """The rows of one page (see `page`), id first: the active ones, then the ended ones.
    The active ones come in order from their own (partial) index; the ended ones are walked
    newest first down the request-time index, which stops at the page's end whatever lies
    behind it. One transaction, so the two parts agree."""
    connection = session.connection()
    scoped = model_id is not None
    params: dict[str, Any] = {"model_id": model_id} if scoped else {}
    rows: list[tuple[Any, ...]] = [
        tuple(row)
        for row in connection.execute(
            queries.scoped_active if scoped else queries.active,
            params | {"limit": limit, "offset": offset},
        )
    ]
    if len(rows) == limit:
        return rows
    if rows or offset == 0:
        active = offset + len(rows)
    else:  # the page starts past the active ones: how many are there?
        active = connection.execute(
            queries.scoped_count if scoped else queries.count, params
        ).scalar_one()
    rows += map(
        tuple,
        connection.execute(
            queries.scoped_ended if scoped else queries.ended,
            params | {"limit": limit - len(rows), "offset": max(0, offset - active)},
        ),
    )
    return rows


def list_active(db: Database) -> list[DeploymentRecord]:
    """Every active deployment, oldest request first (an index read by status), its copies
    included (each row its own record, `copy_of` set on the copies)."""
    query = select(DeploymentRow).where(_active())
    with db.read() as session:
        return _oldest_first(to_record(row) for row in session.scalars(query))


def list_deployed(db: Database) -> list[DeploymentRecord]:
    """Every DEPLOYED row (copies included), oldest request first: what serves now, without
    the queued and unloaded ones (an index read by status)."""
    query = select(DeploymentRow).where(DeploymentRow.status == DeploymentStatus.DEPLOYED.value)
    with db.read() as session:
        return _oldest_first(to_record(row) for row in session.scalars(query))


def copies_of(db: Database, deployment_id: str) -> list[DeploymentRecord]:
    """A deployment's copies, active and ended: copy 0 (the deployment's own row) first,
    then the others by index. Empty when there is no such deployment."""
    query = select(DeploymentRow).where(
        or_(DeploymentRow.id == deployment_id, DeploymentRow.copy_of == deployment_id)
    )
    with db.read() as session:
        records = [to_record(row) for row in session.scalars(query)]
    return sorted(records, key=lambda record: (record.copy_of is not None, record.copy_index))


class Named(NamedTuple):
    """A row as a holder of budget is named: its served name and status, and the deployment
    it is a copy of (its own id for copy 0) with its copy index."""

    name: str
    status: DeploymentStatus
    deployment_id: str
    copy_index: int


def names(db: Database, deployment_ids: Iterable[str]) -> dict[str, Named]:
    """How each of these rows (deployments or copies, by primary key) is named."""
    ids = list(deployment_ids)
    if not ids:
        return {}
    c = DeploymentRow.__table__.c
    query = select(c.id, c.model_name, c.status, c.copy_of, c.copy_index).where(c.id.in_(ids))
    with db.read() as session:
        return {
            row[0]: Named(row[1], DeploymentStatus(row[2]), row[3] or row[0], row[4])
            for row in session.execute(query)
        }


def serving(db: Database, name: str) -> list[DeploymentRecord]:
    """The active deployments whose served name, or id, is `name`: what the gateway routes a
    request for the model `name` to. Index reads (served name and status; id)."""
    query = (
        select(DeploymentRow)
        .where(_active())
        .where(or_(DeploymentRow.model_name == name, DeploymentRow.id == name))
    )
    with db.read() as session:
        return _oldest_first(to_record(row) for row in session.scalars(query))


def _oldest_first(records: Iterable[DeploymentRecord]) -> list[DeploymentRecord]:
    """Sorted here, not in SQL: an ORDER BY would tempt the planner to walk the request-time
    index over every record instead of looking the few active ones up."""
    return sorted(records, key=lambda record: (record.requested_at, record.id))


def ended_before(db: Database, moment: datetime, *, limit: int) -> list[str]:
    """Ids of ended deployments that ended (stopped, or failed) before `moment`, at most
    `limit`, the oldest first; one that still holds a reservation never counts."""
    ended_at = func.coalesce(
        DeploymentRow.stopped_at, DeploymentRow.last_error_at, DeploymentRow.requested_at
    )
    query = (
        select(DeploymentRow.id)
        .where(DeploymentRow.requested_at < moment)  # ended after requested: the index narrows
        .where(_ended())
        .where(ended_at < moment)
        .where(DeploymentRow.id.not_in(select(ReservationRow.deployment_id)))
        .order_by(DeploymentRow.requested_at, DeploymentRow.id)
        .limit(limit)
    )
    with db.read() as session:
        return list(session.scalars(query))


def delete_ended(db: Database, deployment_ids: Iterable[str]) -> int:
    """Delete these deployments' records if they have ended and hold nothing; rows deleted."""
    ids = list(deployment_ids)
    if not ids:
        return 0
    holding = select(ReservationRow.deployment_id)
    # A deployment goes with its copies, and only once none of them is active or holds.
    live_copies = select(DeploymentRow.copy_of).where(
        DeploymentRow.copy_of.is_not(None), or_(_active(), DeploymentRow.id.in_(holding))
    )
    deletable = (
        select(DeploymentRow.id)
        .where(DeploymentRow.id.in_(ids))
        .where(_ended())
        .where(DeploymentRow.id.not_in(holding))
        .where(DeploymentRow.id.not_in(live_copies))
    )
    with db.write() as session:
        doomed = list(session.scalars(deletable))
        copies = list(
            session.scalars(select(DeploymentRow.id).where(DeploymentRow.copy_of.in_(doomed)))
        )
        # Its timeline goes with it, in the same transaction; the copies before the rows
        # they point at.
        session.execute(delete(EventRow).where(EventRow.deployment_id.in_(doomed + copies)))
        gone = affected(session.execute(delete(DeploymentRow).where(DeploymentRow.id.in_(copies))))
        return gone + affected(
            session.execute(delete(DeploymentRow).where(DeploymentRow.id.in_(doomed)))
        )


def claim(db: Database, *, owner: str, lease_s: float, limit: int = 100) -> list[DeploymentRecord]:
    """Take over active deployments that nobody drives: new ones, and those whose driver's
    lease ran out (it died). Each is claimed by a guarded UPDATE, so only one process wins.
    UNLOADED ones are not driven (nothing runs) until `load` makes them REQUESTED."""
    now = utcnow()
    active = [status.value for status in DRIVEN]
    with db.read() as session:
        candidates = session.scalars(
            select(DeploymentRow.id)
            .where(DeploymentRow.status.in_(active))
            .where(_not_placed_with_its_deployment())
            .where(or_(DeploymentRow.claimed_by.is_(None), DeploymentRow.claimed_until < now))
            .order_by(DeploymentRow.requested_at)
            .limit(limit)
        ).all()
    claimed: list[DeploymentRecord] = []
    for deployment_id in candidates:
        with db.write() as session:
            result = session.execute(
                update(DeploymentRow)
                .where(DeploymentRow.id == deployment_id)
                .where(DeploymentRow.status.in_(active))
                .where(_not_placed_with_its_deployment())
                .where(or_(DeploymentRow.claimed_by.is_(None), DeploymentRow.claimed_until < now))
                .values(
                    claimed_by=owner,
                    claimed_until=now + timedelta(seconds=lease_s),
                    **_SAME_REVISION,
                )
            )
            if affected(result) == 1:
                row = session.get(DeploymentRow, deployment_id)
                if row is not None:
                    claimed.append(to_record(row))
    return claimed


_SERVING_OR_STARTING = (DeploymentStatus.INITIALIZING.value, DeploymentStatus.DEPLOYED.value)


@cache
def _not_placed_with_its_deployment() -> ColumnElement[bool]:
    """Not a REQUESTED copy that waits to be placed together with its deployment's copy 0
    (store/copies.py `reserve`): one is claimed on its own only once copy 0 has started
    (a copy placed again after a failure, or added by scaling). Made once: every pass
    claims, and making the alias and its subquery (and their cache key) took longer than
    the claim's own statements."""
    leader = aliased(DeploymentRow)
    started = select(leader.id).where(leader.status.in_(_SERVING_OR_STARTING))
    return or_(
        DeploymentRow.copy_of.is_(None),
        DeploymentRow.status != DeploymentStatus.REQUESTED.value,
        DeploymentRow.copy_of.in_(started),
    )


def renew(db: Database, *, owner: str, lease_s: float) -> None:
    """Extend this owner's leases; what it no longer drives (ended) keeps no lease."""
    with db.write() as session:
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.claimed_by == owner)
            .where(DeploymentRow.status.in_([status.value for status in DRIVEN]))
            .values(claimed_until=utcnow() + timedelta(seconds=lease_s), **_SAME_REVISION)
        )


def let_go(db: Database, *, owner: str) -> None:
    """Give up this owner's leases (a server shutting down cleanly), so the next process to
    look claims its deployments at once instead of waiting for the leases to run out."""
    with db.write() as session:
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.claimed_by == owner)
            .values(claimed_by=None, claimed_until=None, **_SAME_REVISION)
        )


def advance(
    db: Database,
    deployment_id: str,
    *,
    owner: str,
    allowed: Iterable[DeploymentStatus],
    to: DeploymentStatus,
    values: Mapping[str, Any] | None = None,
) -> bool:
    """Move an owned deployment from one of `allowed` to `to`; False when it was not there
    (stopped meanwhile, or owned by another process)."""
    extra = dict(values or {})
    if to is DeploymentStatus.DEPLOYED:
        extra.setdefault("deployed_at", utcnow())
    with db.write() as session:
        result = session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.claimed_by == owner)
            .where(DeploymentRow.status.in_([status.value for status in allowed]))
            .values(status=to.value, **extra)
        )
        return affected(result) == 1


def end(
    db: Database,
    deployment_id: str,
    *,
    failure: DeploymentFailure | None = None,
    owner: str | None = None,
) -> DeploymentRecord | None:
    """End an active deployment: STOPPED (no failure) or the failure's status and error, with
    its reservations released in the same transaction. Returns the record as it was before
    (its engine handle is what the caller must stop), or None when it had already ended or
    (with `owner`) belongs to another process."""
    values = stop_values() if failure is None else failure_values(failure)
    return release_as(db, deployment_id, allowed=ACTIVE, values=values, owner=owner)


def stop_values() -> dict[str, Any]:
    """The columns a stop writes: STOPPED now, no driver."""
    return {
        "claimed_by": None,
        "claimed_until": None,
        "status": DeploymentStatus.STOPPED.value,
        "stopped_at": utcnow(),
    }


def failure_values(failure: DeploymentFailure) -> dict[str, Any]:
    """The columns a failure that ends a deployment writes: its status and error, no driver."""
    values = {"claimed_by": None, "claimed_until": None, "status": failure.status.value}
    return values | error_values(failure)


def error_values(failure: DeploymentFailure) -> dict[str, Any]:
    """The error columns a failure writes."""
    return {
        "last_error_code": failure.code,
        "last_error_message": failure.message,
        "last_error_at": failure.at or utcnow(),
        "no_fit": None if failure.no_fit is None else dict(failure.no_fit),
    }


def release_as(
    db: Database,
    deployment_id: str,
    *,
    allowed: Iterable[DeploymentStatus],
    values: Mapping[str, Any],
    owner: str | None = None,
) -> DeploymentRecord | None:
    """Write `values` on a deployment in one of `allowed` (and, with `owner`, driven by it)
    and release its reservations, in one transaction; the record as it was before, or None
    when the guard did not hold."""
    with db.write() as session:
        row = session.get(DeploymentRow, deployment_id, with_for_update=True)
        if row is None:
            raise RecordNotFound("deployment", deployment_id)
        before = to_record(row)
        query = (
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .where(DeploymentRow.status.in_([status.value for status in allowed]))
        )
        if owner is not None:
            query = query.where(DeploymentRow.claimed_by == owner)
        if affected(session.execute(query.values(**values))) != 1:
            return None
        release(session, deployment_id)
        return before


def statuses(
    db: Database, deployment_ids: Iterable[str]
) -> dict[str, tuple[DeploymentStatus, str | None]]:
    """Status and driver of each id, in one query (what a reconciler checks every tick)."""
    ids = list(deployment_ids)
    if not ids:
        return {}
    with db.read() as session:
        rows = session.execute(
            select(DeploymentRow.id, DeploymentRow.status, DeploymentRow.claimed_by).where(
                DeploymentRow.id.in_(ids)
            )
        ).all()
    return {row[0]: (DeploymentStatus(row[1]), row[2]) for row in rows}


def to_record(row: DeploymentRow) -> DeploymentRecord:
    placement = None
    if row.node_name is not None and row.hardware_class is not None:
        placement = PlacementFields(
            topology=row.topology or "",
            node_name=row.node_name,
            gpu_index=row.gpu_index,
            gpu_indices=tuple((row.gpu_indices or {}).get("indices", ())),
            partition=row.partition,
            gpu_vendor=row.gpu_vendor,
            gpu_id=row.gpu_id,
            hardware_class=row.hardware_class,
            sharing_class=row.sharing_class or "",
            allocated_bytes=row.allocated_bytes or 0,
            device_total_bytes=row.device_total_bytes or 0,
            notices=tuple((row.notices or {}).get("codes", ())),
        )
    requested_at = aware(row.requested_at)
    if requested_at is None:  # pragma: no cover - NOT NULL in the schema
        raise ValueError(f"deployment {row.id} has no requested_at")
    return DeploymentRecord(
        id=row.id,
        model_id=row.model_id,
        config_id=row.config_id,
        file_id=row.file_id,
        model_name=row.model_name,
        engine=row.engine,
        status=DeploymentStatus(row.status),
        request=dict(row.request),
        model_path=row.model_path,
        requested_bytes=row.requested_bytes,
        tensor_parallel=row.tensor_parallel,
        max_model_len=row.max_model_len,
        estimate=row.estimate,
        engine_settings=row.engine_settings or {},
        placement=placement,
        no_fit=row.no_fit,
        last_error_code=row.last_error_code,
        last_error_message=row.last_error_message,
        last_error_at=aware(row.last_error_at),
        engine_handle=row.engine_handle,
        claimed_by=row.claimed_by,
        claimed_until=aware(row.claimed_until),
        requested_at=requested_at,
        deployed_at=aware(row.deployed_at),
        stopped_at=aware(row.stopped_at),
        released_at=aware(row.released_at),
        scaling=Scaling(
            priority=row.priority,
            keep_alive_s=row.keep_alive_s,
            queue=row.queue,
            min_copies=row.min_copies,
            starting_copies=row.starting_copies,
            max_copies=row.max_copies,
            duration_min=row.duration_min,
            ends_at=aware(row.ends_at),
        ),
        last_used_at=aware(row.last_used_at),
        memory_used_bytes=row.memory_used_bytes,
        sleep_level=row.sleep_level,
        memory_sampled_at=aware(row.memory_sampled_at),
        over_budget_since=aware(row.over_budget_since),
        copy_of=row.copy_of,
        copy_index=row.copy_index,
    )
