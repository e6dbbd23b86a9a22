"""Dependencies as `Annotated` aliases: the server's context; the caller every router but
health carries (`Authorized`, `Caller` — the token itself is checked earlier, by
`service.access.guard.AccessGuard`); and the admin check of the routes that deploy, stop, delete or
manage tokens (`AdminOnly`). Who a token names: service/access/tokens.py."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from cohabit.service.access import tokens
from cohabit.service.access.guard import PRINCIPAL_STATE, TOKEN_REFUSED
from cohabit.service.context import ServiceContext

# The dependencies below do no I/O, so they are coroutines: FastAPI runs a plain function
# dependency on a worker thread, one thread hop per dependency on every request.


async def get_context(request: Request) -> ServiceContext:
    context: ServiceContext = request.app.state.context
    return context


Context = Annotated[ServiceContext, Depends(get_context)]


async def current_caller(request: Request) -> tokens.Caller:
    """Who the request acts as, as the guard admitted it; 401 if the guard did not run."""
    caller: tokens.Caller | None = getattr(request.state, PRINCIPAL_STATE, None)
    if caller is None:
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=TOKEN_REFUSED,
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller


Caller = Annotated[tokens.Caller, Depends(current_caller)]
Authorized = Depends(current_caller)


async def require_admin(caller: Caller) -> tokens.Caller:
    if not caller.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=f"token {caller.name!r} has role {caller.role.value}: deploying, stopping, "
            "deleting and managing tokens need an admin token",
        )
    return caller


AdminOnly = Depends(require_admin)
