"""Bodies of the identity routes, in the shapes the `kamiwaza-sdk` auth service validates
(`UserInfo`, `TokenResponse`, `PAT`, `PATCreateResponse`, `PATListResponse`); `role` and
`expires_at` go beyond them."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, Field


class UserInfo(BaseModel):
    """Who the presented token names. There are no user accounts: the username is the
    token's name (`bootstrap` for `--token`, `anonymous` on a token-less server)."""

    username: str
    email: str | None = None
    groups: list[str] = Field(default_factory=list)
    roles: list[str]
    sub: str


class TokenResponse(BaseModel):
    access_token: str
    token_type: str = "bearer"
    expires_in: int
    refresh_token: str | None = None
    id_token: str | None = None


class Pat(BaseModel):
    """A named token as listed; never its secret. `jti` (= `id`) revokes it."""

    id: UUID
    jti: str
    name: str
    role: str
    owner_id: str
    scope: str | None = None
    aud: str | None = None
    ttl_seconds: int | None = None
    exp: int | None = Field(default=None, description="Expiry as Unix seconds; None: never.")
    expires_at: datetime | None = None
    tenant_id: str | None = None
    created_at: datetime
    updated_at: datetime
    revoked: bool


class PatList(BaseModel):
    pats: list[Pat]


class PatCreated(BaseModel):
    """The token itself appears here once; the server keeps only its SHA-256."""

    token: str
    pat: Pat


class PatRevoked(BaseModel):
    jti: str
    revoked: bool = True
