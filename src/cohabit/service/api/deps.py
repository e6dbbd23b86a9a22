"""Dependencies as `Annotated` aliases: the server's context, and the bearer-token check every
router but health carries."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status

from cohabit.service.context import ServiceContext


def get_context(request: Request) -> ServiceContext:
    context: ServiceContext = request.app.state.context
    return context


Context = Annotated[ServiceContext, Depends(get_context)]


def require_token(context: Context, authorization: Annotated[str | None, Header()] = None) -> None:
    """With a token configured, every call must send `Authorization: Bearer <token>`."""
    expected = context.settings.token
    if not expected:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip(), expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail="missing or wrong bearer token (send 'Authorization: Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )


Authorized = Depends(require_token)
