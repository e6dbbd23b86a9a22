"""/api/ping, /api/auth/…: the liveness answer, who a token names, the password grant the
kamiwaza client's login sends (the "password" is an API token: there are no user accounts),
and named API tokens — create, list, revoke — in the client's personal-access-token shapes."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qs
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import AfterValidator
from starlette.concurrency import run_in_threadpool

from cohabit import __version__
from cohabit.service.access import tokens
from cohabit.service.api.auth_schemas import (
    Pat,
    PatCreated,
    PatList,
    PatRevoked,
    TokenResponse,
    UserInfo,
)
from cohabit.service.api.deps import AdminOnly, Authorized, Caller, Context
from cohabit.service.api.schemas import GUARDED, TAKEN, ErrorMessage, answers
from cohabit.service.errors import Conflict
from cohabit.store.database import utcnow
from cohabit.store.tokens import TokenRecord

open_router = APIRouter(tags=["auth"], responses=answers(403))  # answers without a token
router = APIRouter(prefix="/auth", tags=["auth"], dependencies=[Authorized], responses=GUARDED)
admin = APIRouter(prefix="/auth", tags=["auth"], dependencies=[AdminOnly], responses=GUARDED)

MAX_TTL_S = 100 * 365 * 24 * 3600  # a token's lifetime: at most a century

# What a login answers as the lifetime of a token that never expires: the client logs in
# again after it, and gets the same token back.
LOGIN_LIFETIME_S = 3600


@open_router.get("/ping")
def ping() -> dict[str, str]:
    """Liveness, open without a token: the server answers HTTP."""
    return {"status": "ok", "service": "cohabit", "version": __version__}


THROTTLED: dict[int | str, dict[str, Any]] = {
    429: {"model": ErrorMessage, "description": "Too many failed logins; see Retry-After."}
}


@open_router.post(
    "/auth/token", response_model=TokenResponse, responses=answers(400, 401) | TAKEN | THROTTLED
)
async def login(request: Request, context: Context) -> TokenResponse:
    """The OAuth password grant (form or JSON body). `password` must be an API token, which
    is answered back as the access token; `username` is not checked."""
    fields = await _form(request)
    if fields.get("grant_type", "password") != "password":
        raise HTTPException(
            status_code=status.HTTP_400_BAD_REQUEST,
            detail="unsupported_grant_type: only grant_type=password is served",
        )
    if not context.settings.token:
        raise Conflict(
            "this server runs without an API token: call it without logging in (no api_key)"
        )
    throttle = context.authenticator.login_throttle
    client = request.client.host if request.client is not None else ""
    wait_s = throttle.retry_after_s(client)
    if wait_s is not None:
        # Refused before the password is looked at: the right one would tell a guesser so.
        raise HTTPException(
            status_code=status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"too many failed logins from {client}: try again in {wait_s} s",
            headers={"Retry-After": str(wait_s)},
        )
    password = fields.get("password") or ""
    caller = await run_in_threadpool(tokens.identify, context.db, context.settings.token, password)
    if isinstance(caller, tokens.Refused):
        throttle.failed(client)
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="Invalid credentials: the password must be an API token of this server",
        )
    throttle.succeeded(client)
    lifetime = LOGIN_LIFETIME_S
    if caller.expires_at is not None:
        lifetime = min(lifetime, int((caller.expires_at - utcnow()).total_seconds()))
    return TokenResponse(access_token=password, expires_in=max(lifetime, 1))


async def _form(request: Request) -> dict[str, str]:
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data: Any = json.loads(body or b"{}")
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise HTTPException(
                status_code=status.HTTP_400_BAD_REQUEST, detail="body: not a JSON object"
            )
        return {str(key): str(value) for key, value in data.items()}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[-1] for key, values in parsed.items()}


@router.get("/users/me", response_model=UserInfo)
def users_me(caller: Caller) -> UserInfo:
    """The caller the presented token names: its name, role and id."""
    return UserInfo(
        username=caller.name, roles=[caller.role.value], sub=caller.token_id or caller.name
    )


@router.get("/health")
def auth_health() -> dict[str, str]:
    return {"status": "ok"}


# The names callers without a named token go by: a token called so would pass for them.
RESERVED_NAMES = frozenset({tokens.BOOTSTRAP, tokens.ANONYMOUS})


def _unreserved(name: str) -> str:
    if name.strip().lower() in RESERVED_NAMES:
        raise ValueError(f"{name!r} is reserved (the server's own callers go by it)")
    return name


TokenName = Annotated[
    str,
    AfterValidator(_unreserved),
    Query(min_length=1, max_length=255, description="The token's name."),
]


@admin.post(
    "/pats", response_model=PatCreated, status_code=status.HTTP_201_CREATED, responses=TAKEN
)
def create_pat(
    context: Context,
    caller: Caller,
    name: TokenName,
    role: tokens.Role = tokens.Role.USER,
    ttl_seconds: Annotated[int | None, Query(ge=1, le=MAX_TTL_S)] = None,
    scope: str | None = None,
    aud: str | None = None,
) -> PatCreated:
    """Mint a named token (default role `user`); its plaintext is in this answer only."""
    issued = tokens.issue(
        context.db,
        context.settings.token,
        name=name,
        role=role,
        created_by=caller.name,
        ttl_s=ttl_seconds,
        scope=scope,
        audience=aud,
    )
    return PatCreated(token=issued.token, pat=pat_view(issued.record))


@admin.get("/pats", response_model=PatList)
def list_pats(context: Context) -> PatList:
    """Every named token, revoked and expired ones included (see `revoked`, `exp`)."""
    return PatList(pats=[pat_view(record) for record in tokens.list_tokens(context.db)])


@admin.delete("/pats/{jti}", response_model=PatRevoked, responses=answers(404))
def revoke_pat(jti: str, context: Context) -> PatRevoked:
    """Revoke by id (or by name, when one unrevoked token has it); refused from now on."""
    record = tokens.revoke(context.db, jti)
    return PatRevoked(jti=record.id)


def pat_view(record: TokenRecord) -> Pat:
    ttl = None
    if record.expires_at is not None:
        ttl = round((record.expires_at - record.created_at).total_seconds())
    return Pat(
        id=UUID(record.id),
        jti=record.id,
        name=record.name,
        role=record.role,
        owner_id=record.created_by,
        scope=record.scope,
        aud=record.audience,
        ttl_seconds=ttl,
        exp=None if record.expires_at is None else int(record.expires_at.timestamp()),
        expires_at=record.expires_at,
        created_at=record.created_at,
        updated_at=_latest(record.created_at, record.revoked_at),
        revoked=record.revoked_at is not None,
    )


def _latest(first: datetime, then: datetime | None) -> datetime:
    return first if then is None else max(first, then)
