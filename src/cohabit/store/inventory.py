"""Inventory an admin registers through the cluster API beside the fleet: locations, clusters
and hardware entries, as the reference's cluster service creates them. They describe what an
organisation has; placement never reads them (it places on the fleet the server discovers or
is given, store/ledger.py), so registering hardware here reserves nothing and runs nothing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from cohabit.store.database import Database, aware, utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.tables import InventoryRow


class InventoryKind(StrEnum):
    LOCATION = "location"
    CLUSTER = "cluster"
    HARDWARE = "hardware"


@dataclass(frozen=True, slots=True, kw_only=True)
class InventoryRecord:
    """One registered entry: its name and the other fields it was given (the kind's own)."""

    id: str
    kind: InventoryKind
    name: str
    fields: dict[str, Any]
    created_at: datetime


def add(db: Database, kind: InventoryKind, name: str, fields: dict[str, Any]) -> InventoryRecord:
    row = InventoryRow(
        id=str(uuid.uuid4()), kind=kind.value, name=name, fields=fields, created_at=utcnow()
    )
    with db.write() as session:
        session.add(row)
        session.flush()
        return _record(row)


def get(db: Database, kind: InventoryKind, entry_id: str) -> InventoryRecord:
    """The entry; RecordNotFound when there is none of that kind with that id."""
    with db.read() as session:
        return _record(_row(session, kind, entry_id))


def list_kind(db: Database, kind: InventoryKind) -> list[InventoryRecord]:
    """Every entry of the kind, oldest first (ties by id, so the order never changes)."""
    query = (
        select(InventoryRow)
        .where(InventoryRow.kind == kind.value)
        .order_by(InventoryRow.created_at, InventoryRow.id)
    )
    with db.read() as session:
        return [_record(row) for row in session.scalars(query)]


def replace(
    db: Database, kind: InventoryKind, entry_id: str, name: str, fields: dict[str, Any]
) -> InventoryRecord:
    """The entry with this name and these fields in place of its own (its id and creation
    time kept); RecordNotFound when there is none."""
    with db.write() as session:
        row = _row(session, kind, entry_id)
        row.name, row.fields = name, fields
        session.flush()
        return _record(row)


def remove(db: Database, kind: InventoryKind, entry_id: str) -> None:
    """Delete the entry; RecordNotFound when there is none."""
    with db.write() as session:
        session.delete(_row(session, kind, entry_id))


def _row(session: Session, kind: InventoryKind, entry_id: str) -> InventoryRow:
    row = session.get(InventoryRow, entry_id)
    if row is None or row.kind != kind.value:
        raise RecordNotFound(kind.value, entry_id)
    return row


def _record(row: InventoryRow) -> InventoryRecord:
    return InventoryRecord(
        id=row.id,
        kind=InventoryKind(row.kind),
        name=row.name,
        fields=dict(row.fields or {}),
        created_at=aware(row.created_at) or utcnow(),
    )
