"""Named API tokens: their digests, names, roles and lifetimes. The service decides what a
token may do (service/access/tokens.py); this only stores rows and finds one by its digest. The
plaintext never reaches this module."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from cohabit.store.database import Database, aware, utcnow
from cohabit.store.errors import Conflict, RecordNotFound
from cohabit.store.tables import ApiTokenRow


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    id: str
    name: str
    role: str
    created_by: str
    scope: str | None
    audience: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewToken:
    name: str
    role: str
    token_sha256: str
    created_by: str
    scope: str | None
    audience: str | None
    expires_at: datetime | None


def add_token(db: Database, new: NewToken) -> TokenRecord:
    """Insert a token. Raises Conflict when a live (unrevoked, unexpired) token has the name."""
    now = utcnow()
    with db.write() as session:
        clash = session.scalars(
            select(ApiTokenRow).where(
                ApiTokenRow.name == new.name, ApiTokenRow.revoked_at.is_(None)
            )
        ).all()
        if any(_live(row, now) for row in clash):
            raise Conflict(f"a live token is already named {new.name!r}: revoke it or pick another")
        row = ApiTokenRow(
            id=str(uuid.uuid4()),
            name=new.name,
            role=new.role,
            token_sha256=new.token_sha256,
            created_by=new.created_by,
            scope=new.scope,
            audience=new.audience,
            created_at=now,
            expires_at=new.expires_at,
            revoked_at=None,
        )
        session.add(row)
        try:
            session.flush()
        except IntegrityError:
            # Two equal digests mean two equal 256-bit secrets: not a user's doing.
            raise Conflict("token digest already stored; make another token") from None
        return _record(row)


def find_by_digest(db: Database, token_sha256: str) -> TokenRecord | None:
    with db.read() as session:
        row = session.scalars(
            select(ApiTokenRow).where(ApiTokenRow.token_sha256 == token_sha256)
        ).first()
        return None if row is None else _record(row)


def list_tokens(db: Database) -> list[TokenRecord]:
    with db.read() as session:
        rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id))
        return [_record(row) for row in rows]


def revoke(db: Database, token_id: str) -> TokenRecord:
    """Mark it revoked (from now on it is refused); a second revoke changes nothing."""
    with db.write() as session:
        row = session.get(ApiTokenRow, token_id)
        if row is None:
            raise RecordNotFound("token", token_id)
        if row.revoked_at is None:
            row.revoked_at = utcnow()
        session.flush()
        return _record(row)


def _live(row: ApiTokenRow, now: datetime) -> bool:
    expires_at = aware(row.expires_at)
    return row.revoked_at is None and (expires_at is None or expires_at > now)


def _record(row: ApiTokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        name=row.name,
        role=row.role,
        created_by=row.created_by,
        scope=row.scope,
        audience=row.audience,
        created_at=aware(row.created_at) or utcnow(),
        expires_at=aware(row.expires_at),
        revoked_at=aware(row.revoked_at),
    )
