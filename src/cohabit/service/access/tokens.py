"""Who is calling, and what they may do. A server started with `--token` requires a bearer
token on every API call: that bootstrap token is an admin, and admins mint named tokens
(stored as SHA-256 digests; the plaintext is answered once) with a role — `admin` may deploy,
stop and delete and manage tokens, `user` may read and chat. A server without `--token`
listens on loopback only and treats every caller as an admin, and named tokens are refused
there. `identify()` is the one check the API's dependencies and the gateway call.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from cohabit.service.errors import Conflict, InvalidInput, found
from cohabit.store import tokens as store
from cohabit.store.database import Database, utcnow
from cohabit.store.tokens import NewToken, TokenRecord

TOKEN_PREFIX = "cohabit_"  # marks a named token in logs and secret scanners
BOOTSTRAP = "bootstrap"  # the name the --token caller goes by
ANONYMOUS = "anonymous"  # the name every caller of a token-less server goes by


class Role(StrEnum):
    ADMIN = "admin"
    USER = "user"


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who sent a request. `token_id` is None for the bootstrap token and token-less servers."""

    name: str
    role: Role
    token_id: str | None = None
    expires_at: datetime | None = None

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """Why a bearer token was not accepted: one line for the 401 body."""

    reason: str


MISSING = Refused(reason="missing or wrong bearer token (send 'Authorization: Bearer <token>')")


@dataclass(frozen=True, slots=True, kw_only=True)
class Issued:
    """A new token: its plaintext (shown this once) and what is stored about it."""

    token: str
    record: TokenRecord


def digest(token: str) -> str:
    """The SHA-256 hex digest stored in place of a token. Tokens carry 256 random bits, so a
    fast hash suffices: there is nothing to guess that a slow hash would protect."""
    return hashlib.sha256(token.encode()).hexdigest()


def identify(db: Database, bootstrap: str | None, presented: str | None) -> Caller | Refused:
    """The caller a bearer token names, or why it is refused. `bootstrap` is the server's
    `--token` (None: no token required); `presented` the token the request sent."""
    if not bootstrap:
        return Caller(name=ANONYMOUS, role=Role.ADMIN)
    if not presented:
        return MISSING
    if secrets.compare_digest(presented.encode(), bootstrap.encode()):
        return Caller(name=BOOTSTRAP, role=Role.ADMIN)
    record = store.find_by_digest(db, digest(presented))
    if record is None:
        return MISSING
    if record.revoked_at is not None:
        return Refused(reason=f"token {record.name!r} was revoked")
    if record.expires_at is not None and record.expires_at <= utcnow():
        return Refused(
            reason=f"token {record.name!r} expired at {record.expires_at:%Y-%m-%d %H:%M}"
        )
    return Caller(
        name=record.name, role=Role(record.role), token_id=record.id, expires_at=record.expires_at
    )


def issue(
    db: Database,
    bootstrap: str | None,
    *,
    name: str,
    role: Role,
    created_by: str,
    ttl_s: int | None = None,
    scope: str | None = None,
    audience: str | None = None,
) -> Issued:
    """Mint a named token. Raises Conflict on a token-less server or a name in use."""
    if not bootstrap:
        raise Conflict(
            "this server runs without an API token, so it accepts every caller on 127.0.0.1: "
            "start it with --token (or COHABIT_API_TOKEN) to use named tokens"
        )
    name = name.strip()
    if not name or len(name) > 255:
        raise InvalidInput("name: give the token a name of 1 to 255 characters")
    if ttl_s is not None and ttl_s < 1:
        raise InvalidInput(f"ttl_seconds: {ttl_s} is not a positive number of seconds")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    new = NewToken(
        name=name,
        role=role.value,
        token_sha256=digest(token),
        created_by=created_by,
        scope=scope,
        audience=audience,
        expires_at=None if ttl_s is None else utcnow() + timedelta(seconds=ttl_s),
    )
    return Issued(token=token, record=found(lambda: store.add_token(db, new)))


def list_tokens(db: Database) -> list[TokenRecord]:
    return store.list_tokens(db)


def revoke(db: Database, ref: str) -> TokenRecord:
    """Revoke by id, or by name when exactly one unrevoked token has it."""
    records = store.list_tokens(db)
    by_id = [r for r in records if r.id == ref]
    if not by_id:
        by_id = [r for r in records if r.name == ref and r.revoked_at is None]
    if len(by_id) > 1:
        ids = ", ".join(r.id for r in by_id)
        raise Conflict(f"{len(by_id)} tokens are named {ref!r} ({ids}): revoke one by id")
    token_id = by_id[0].id if by_id else ref
    return found(lambda: store.revoke(db, token_id))
