"""Dependencies as `Annotated` aliases: the server's context, the bearer-token check every
router but health carries (`Authorized`), and the admin check of the routes that deploy,
stop, delete or manage tokens (`AdminOnly`). Who a token names: service/tokens.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request, status

from cohabit.service import tokens
from cohabit.service.context import ServiceContext


def get_context(request: Request) -> ServiceContext:
    context: ServiceContext = request.app.state.context
    return context


Context = Annotated[ServiceContext, Depends(get_context)]


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for any other header."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return given.strip() or None


def require_token(
    context: Context, authorization: Annotated[str | None, Header()] = None
) -> tokens.Caller:
    """With a token configured, every call must send `Authorization: Bearer <token>` naming
    the bootstrap token or a live named token. Answers who the caller is."""
    caller = tokens.identify(context.db, context.settings.token, bearer(authorization))
    if isinstance(caller, tokens.Refused):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=caller.reason,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller


Caller = Annotated[tokens.Caller, Depends(require_token)]


def require_admin(caller: Caller) -> tokens.Caller:
    if not caller.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=f"token {caller.name!r} has role {caller.role.value}: deploying, stopping, "
            "deleting and managing tokens need an admin token",
        )
    return caller


Authorized = Depends(require_token)
AdminOnly = Depends(require_admin)
