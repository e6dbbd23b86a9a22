"""Dependencies as `Annotated` aliases: the server's context, and the principal every router
but health carries (the token itself is checked earlier, by `service.auth.AccessGuard`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from cohabit.service.auth import PRINCIPAL_STATE, TOKEN_REFUSED, Principal
from cohabit.service.context import ServiceContext


def get_context(request: Request) -> ServiceContext:
    context: ServiceContext = request.app.state.context
    return context


Context = Annotated[ServiceContext, Depends(get_context)]


def current_principal(request: Request) -> Principal:
    """Who the request acts as, as the guard admitted it; 401 if the guard did not run."""
    principal: Principal | None = getattr(request.state, PRINCIPAL_STATE, None)
    if principal is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=TOKEN_REFUSED,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]
Authorized = Depends(current_principal)


def require_token(context: ServiceContext, authorization: str | None) -> None:
    """The gateway's own check, `Authenticator.check_header` on the header's bytes; raises
    the 401 HTTPException."""
    if not context.authenticator.required:
        return
    presented = None if authorization is None else authorization.encode("latin-1")
    if context.authenticator.check_header(presented) is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=TOKEN_REFUSED,
            headers={"WWW-Authenticate": "Bearer"},
        )
