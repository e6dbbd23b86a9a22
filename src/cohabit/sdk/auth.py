"""`client.auth`: is the server there, who does this client's token name, and the named API
tokens an admin manages (create — the secret is answered once —, list, revoke).
`AsyncAuthService` is the same, awaited."""

from __future__ import annotations

from cohabit.sdk import calls
from cohabit.sdk.http import AsyncHttpSession, HttpSession
from cohabit.sdk.schemas import ApiToken, CreatedToken, UserInfo

ROLES = ("user", "admin")


class AuthService:
    def __init__(self, http: HttpSession) -> None:
        self._http = http

    def ping(self) -> dict[str, str]:
        """`GET /ping`: answers without a token while the server is up."""
        return self._http.run(calls.ping())

    def whoami(self) -> UserInfo:
        """The name and role of the token this client sends (`anonymous`, admin, on a
        server without tokens)."""
        return self._http.run(calls.whoami())

    def create_token(
        self, name: str, *, role: str = "user", ttl_s: int | None = None
    ) -> CreatedToken:
        """A new named token (role `user`: read and chat; `admin`: also deploy, stop, delete
        and manage tokens). Keep `.token`: the server stores only its digest."""
        return self._http.run(calls.create_token(name, role=role, ttl_s=ttl_s))

    def list_tokens(self) -> list[ApiToken]:
        return self._http.run(calls.tokens())

    def revoke_token(self, ref: str) -> str:
        """Revoke by id, or by name when one unrevoked token has it; answers the id."""
        return self._http.run(calls.revoke_token(ref))


class AsyncAuthService:
    def __init__(self, http: AsyncHttpSession) -> None:
        self._http = http

    async def ping(self) -> dict[str, str]:
        return await self._http.run(calls.ping())

    async def whoami(self) -> UserInfo:
        return await self._http.run(calls.whoami())

    async def create_token(
        self, name: str, *, role: str = "user", ttl_s: int | None = None
    ) -> CreatedToken:
        return await self._http.run(calls.create_token(name, role=role, ttl_s=ttl_s))

    async def list_tokens(self) -> list[ApiToken]:
        return await self._http.run(calls.tokens())

    async def revoke_token(self, ref: str) -> str:
        return await self._http.run(calls.revoke_token(ref))
