"""The ledger: the fleet's nodes and the reservations held on them, and `reserve()`, the one
place a placement becomes true — capacity re-checked by the planner and reservations inserted
in one locked transaction. The reconciler calls it; nothing else writes reservations.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from sqlalchemy import URL, delete, select, update
from sqlalchemy.orm import Session

from cohabit.hardware.model import Fleet, NoticeCode, Topology
from cohabit.placement.decision import Allocation, Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Measurement, Reservation
from cohabit.store.database import Database, affected, aware, utcnow
from cohabit.store.nodes import node_from_json, node_to_json
from cohabit.store.records import DeploymentStatus, ReservationRecord
from cohabit.store.tables import DeploymentRow, NodeRow, ReservationRow

# Parsed fleets by (database URL, rows' stamp), for `load_fleet`, and the last state of
# each database with the reservation rows it was made from, for `fleet_state`; the newest few.
_FLEETS: dict[tuple[URL, tuple[Any, ...]], Fleet] = {}
_STATES: dict[URL, tuple[tuple[Any, ...], FleetState]] = {}
_FLEETS_KEPT = 8
_FLEETS_LOCK = threading.Lock()
# What every plan and every view of the fleet reads first, built once (SQLAlchemy compiles
# each once per database kind): the nodes' stamps, and every held reservation.
_NODE_STAMPS = select(
    NodeRow.__table__.c.name, NodeRow.__table__.c.position, NodeRow.__table__.c.updated_at
).order_by(NodeRow.__table__.c.position)
_RESERVATIONS = select(
    ReservationRow.__table__.c.deployment_id,
    ReservationRow.__table__.c.node_name,
    ReservationRow.__table__.c.gpu_index,
    ReservationRow.__table__.c.partition_index,
    ReservationRow.__table__.c.reserved_bytes,
    ReservationRow.__table__.c.budget_bytes,
    ReservationRow.__table__.c.host_bytes,
).order_by(ReservationRow.__table__.c.id)


def save_fleet(db: Database, fleet: Fleet) -> None:
    """Make the stored nodes this fleet. Reservations on nodes that left are kept: they still
    belong to deployments, and count against nothing (FleetState's rule)."""
    now = utcnow()
    with db.write() as session:
        db.lock_ledger(session)
        names = [node.name for node in fleet.nodes]
        session.execute(delete(NodeRow).where(NodeRow.name.not_in(names)))
        for position, node in enumerate(fleet.nodes):
            values = {
                "position": position,
                "spec": node_to_json(node),
                "topology": fleet.topology.value,
                "fractional": fleet.fractional,
                "sharing_configured": fleet.sharing_configured,
                "updated_at": now,
            }
            row = session.get(NodeRow, node.name)
            if row is None:
                session.add(NodeRow(name=node.name, created_at=now, **values))
            else:
                for key, value in values.items():
                    setattr(row, key, value)


def load_fleet(session: Session) -> Fleet:
    """The stored fleet. Parsed once per version: `save_fleet` stamps every row it writes,
    so the rows' names, positions and stamps identify what they hold, and reading those is
    all a request pays while the fleet stays the same (the hardware view, every plan)."""
    stamp = tuple(map(tuple, session.connection().execute(_NODE_STAMPS)))
    key = (_url(session), stamp)
    with _FLEETS_LOCK:
        fleet = _FLEETS.get(key)
    if fleet is not None:
        return fleet
    rows = session.scalars(select(NodeRow).order_by(NodeRow.position)).all()
    if not rows:
        return Fleet(nodes=())
    first = rows[0]
    fleet = Fleet(
        topology=Topology(first.topology),
        fractional=first.fractional,
        sharing_configured=first.sharing_configured,
        nodes=tuple(node_from_json(row.spec) for row in rows),
    )
    if tuple((row.name, row.position, row.updated_at) for row in rows) == stamp:
        with _FLEETS_LOCK:  # unchanged between the two reads: this is the stamped fleet
            _FLEETS[key] = fleet
            while len(_FLEETS) > _FLEETS_KEPT:
                del _FLEETS[next(iter(_FLEETS))]
    return fleet


def _url(session: Session) -> URL:
    """The database a session reads (what the caches above are kept per)."""
    return session.get_bind().engine.url


def fleet_state(session: Session) -> FleetState:
    """The snapshot the planner decides against: stored nodes plus every held reservation.
    The same object as last time while neither changed (it is immutable), so callers can
    keep what they derived from it."""
    fleet = load_fleet(session)
    rows = tuple(map(tuple, session.connection().execute(_RESERVATIONS)))
    url = _url(session)
    with _FLEETS_LOCK:
        last = _STATES.get(url)
    if last is not None and last[1].fleet is fleet and last[0] == rows:
        return last[1]
    reservations = tuple(
        Reservation(
            deployment=deployment,
            node=node,
            gpu_index=gpu_index,
            partition_index=partition_index,
            reserved_bytes=reserved_bytes,
            budget_bytes=budget_bytes,
            host_bytes=host_bytes or 0,
        )
        for (
            deployment,
            node,
            gpu_index,
            partition_index,
            reserved_bytes,
            budget_bytes,
            host_bytes,
        ) in rows
    )
    state = FleetState(fleet=fleet, reservations=reservations)
    with _FLEETS_LOCK:
        _STATES[url] = (rows, state)
        while len(_STATES) > _FLEETS_KEPT:
            del _STATES[next(iter(_STATES))]
    return state


def reserve(
    db: Database,
    *,
    deployment_id: str,
    owner: str,
    request: PlacementRequest,
    measurement: Measurement | None = None,
) -> Placement | NoFit | None:
    """Plan `request` against the ledger as it is now and, when it fits, hold the budget.
    `measurement`: the meter's latest figures (memory held outside cohabit), when known.

    One transaction under the ledger lock, so concurrent reservers (threads or processes) see
    each other's rows. None when the deployment is no longer this owner's DEPLOYING one (it was
    stopped, or another reconciler took it over): nothing is written then.
    """
    with db.write() as session:
        db.lock_ledger(session)
        # The row lock keeps a concurrent stop from ending it between this check and the insert.
        row = session.get(DeploymentRow, deployment_id, with_for_update=True)
        if row is None or row.status != DeploymentStatus.DEPLOYING or row.claimed_by != owner:
            return None
        state = fleet_state(session).with_measurement(measurement)
        decision = plan(state, request)
        if isinstance(decision, Placement):
            hold(session, row, decision, state.fleet.topology)
        return decision


def hold(session: Session, row: DeploymentRow, placement: Placement, topology: Topology) -> None:
    """Insert the placement's reservations for `row` and write where it landed on the row
    (inside the caller's transaction, under the ledger lock)."""
    now = utcnow()
    for held in placement.reservations(row.id):
        session.add(
            ReservationRow(
                deployment_id=row.id,
                node_name=held.node,
                gpu_index=held.gpu_index,
                partition_index=held.partition_index,
                reserved_bytes=held.reserved_bytes,
                created_at=now,
            )
        )
    columns = placement.record_fields(topology)
    row.topology = columns.topology
    row.node_name = columns.node_name
    row.gpu_index = columns.gpu_index
    row.gpu_indices = {"indices": list(columns.gpu_indices)}
    row.partition = columns.partition
    row.gpu_vendor = columns.gpu_vendor
    row.gpu_id = columns.gpu_id
    row.hardware_class = columns.hardware_class
    row.sharing_class = columns.sharing_class
    row.allocated_bytes = columns.allocated_bytes
    row.device_total_bytes = columns.device_total_bytes
    row.notices = {"codes": list(columns.notices)}


def release(session: Session, deployment_id: str) -> int:
    """Drop a deployment's reservations (inside the caller's transaction); rows removed. A
    sleeping engine's residue goes with them, and so does its sleep (store/residency.py)."""
    result = session.execute(
        delete(ReservationRow).where(ReservationRow.deployment_id == deployment_id)
    )
    removed = affected(result)
    if removed:
        session.execute(
            update(DeploymentRow)
            .where(DeploymentRow.id == deployment_id)
            .values(released_at=utcnow(), sleep_level=None)
        )
    return removed


def reservations(db: Database) -> list[ReservationRecord]:
    with db.read() as session:
        return [
            ReservationRecord(
                deployment_id=row.deployment_id,
                node_name=row.node_name,
                gpu_index=row.gpu_index,
                partition_index=row.partition_index,
                reserved_bytes=row.reserved_bytes,
            )
            for row in session.scalars(select(ReservationRow).order_by(ReservationRow.id))
        ]


def current_state(db: Database) -> FleetState:
    with db.read() as session:
        return fleet_state(session)


def held_placement(db: Database, deployment_id: str, request: PlacementRequest) -> Placement | None:
    """The placement a deployment's reservations describe (to relaunch its engine after a
    restart); None when it holds nothing, or a slot it holds has left the fleet."""
    with db.read() as session:
        state = fleet_state(session)
    held = [r for r in state.reservations if r.deployment == deployment_id]
    by_key = {slot.key: slot for slot in state.slots}
    if not held or any(r.slot_key not in by_key for r in held):
        return None
    allocations = tuple(  # a sleeping engine is relaunched with its whole budget
        Allocation(slot=by_key[r.slot_key], allocated_bytes=r.budget_bytes or r.reserved_bytes)
        for r in held
    )
    notices: list[NoticeCode] = []
    for allocation in allocations:
        notices.extend(code for code in allocation.slot.notices if code not in notices)
    return Placement(
        name=deployment_id,
        request=request,
        node=held[0].node,
        allocations=allocations,
        notices=tuple(notices),
    )


def nodes_seen(db: Database) -> dict[str, tuple[datetime, datetime]]:
    """Per node name: when it was first stored and when it was last refreshed."""
    with db.read() as session:
        rows = session.execute(select(NodeRow.name, NodeRow.created_at, NodeRow.updated_at))
        seen: dict[str, tuple[datetime, datetime]] = {}
        for name, created_at, updated_at in rows:
            last = aware(updated_at) or utcnow()
            seen[name] = (aware(created_at) or last, last)
        return seen
