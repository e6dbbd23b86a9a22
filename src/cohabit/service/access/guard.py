"""Who may call the server, decided before anything reads a request's body: `AccessGuard`, a
plain ASGI middleware that `app.create_app` puts in front of every route, and
`Authenticator.check_token`, the one place a presented bearer token becomes a caller
(`tokens.Caller`: the bootstrap admin, or a named token with its role).

With a token configured every path but the open ones (`OPEN_PATHS`, `OPEN_PREFIXES`) needs
`Authorization: Bearer <token>`; the 401 goes out without the body being read. The metrics
token (`Settings.metrics_token`), when set, is good for `/metrics` and nothing else. Without a
token the server answers only requests whose `Host` names the loopback interface or a name
of `Settings.allowed_hosts`, so a page on another site cannot reach it through DNS
rebinding. No CORS headers are ever sent: browsers keep other origins out.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

import anyio.to_thread
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from cohabit.service.access import tokens
from cohabit.service.access.throttle import FailureThrottle
from cohabit.service.paths import GATEWAY_PREFIXES, HEALTH_PATH, METRICS_PATH, OPENAI_PREFIX
from cohabit.service.settings import Settings
from cohabit.store.database import Database

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Health, the connection check, login (it takes a token as its password), and the web page
# (it holds no data).
OPEN_PATHS = frozenset({HEALTH_PATH, "/api/ping", "/api/auth/token", "/"})
OPEN_PREFIXES = ("/ui/static/",)  # the page's script and styles
BEARER_SCHEME = "bearer"  # its name in the OpenAPI document
PRINCIPAL_STATE = "principal"  # the key in the request's state (`request.state.principal`)


SERVER_TOKEN = tokens.Caller(name=tokens.BOOTSTRAP, role=tokens.Role.ADMIN)
LOCAL = tokens.Caller(name=tokens.ANONYMOUS, role=tokens.Role.ADMIN)  # no token: loopback
SCRAPER = tokens.Caller(name="metrics", role=tokens.Role.USER)  # the metrics token, /metrics


class Authenticator:
    """The server's tokens. `check_token` is the seam every check goes through (the
    middleware, which checks the gateway's requests too): the bootstrap token (`--token`) is
    compared as bytes, without touching the database; any other token is looked up among
    the named ones (service/access/tokens.py), which takes a database read, so callers on the event
    loop run it in a thread."""

    def __init__(self, settings: Settings, db: Database | None = None) -> None:
        self._bootstrap = settings.token
        self._server_token = settings.token.encode() if settings.token else None
        self._metrics_token = settings.metrics_token.encode() if settings.metrics_token else None
        # Named tokens live in the store; the app attaches its database once it opens it.
        self.database = db
        # Failed logins per client address (the login route counts and consults it).
        self.login_throttle = FailureThrottle()

    @property
    def required(self) -> bool:
        """Whether callers must present a token at all (else: loopback only, see the guard)."""
        return self._server_token is not None

    def check_bootstrap(self, presented: bytes) -> tokens.Caller | None:
        """The admin the bootstrap token stands for, when `presented` is it; no I/O."""
        if self._server_token is not None and hmac.compare_digest(presented, self._server_token):
            return SERVER_TOKEN
        return None

    def check_metrics(self, presented: bytes) -> tokens.Caller | None:
        """The scraper, when `presented` is the metrics token (good on /metrics only); no I/O."""
        if self._metrics_token is not None and hmac.compare_digest(presented, self._metrics_token):
            return SCRAPER
        return None

    def check_token(self, presented: bytes) -> tokens.Caller | tokens.Refused:
        """Who `presented` (the raw bytes after `Bearer `) stands for, or why it is refused.
        Bytes on both sides: a header is not text, and a non-ASCII one must be a plain no."""
        caller = self.check_bootstrap(presented)
        if caller is not None:
            return caller
        if self.database is None or not presented:
            return tokens.MISSING
        try:
            text = presented.decode("ascii")
        except UnicodeDecodeError:
            return tokens.MISSING
        return tokens.identify(self.database, self._bootstrap, text)

    def check_header(self, authorization: bytes | None) -> tokens.Caller | tokens.Refused:
        """Who an `Authorization` header value stands for, or why it is refused."""
        scheme, _, presented = (authorization or b"").strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return tokens.MISSING
        return self.check_token(presented.strip())


class AccessGuard:
    """The ASGI middleware: refuses, before the app (and so before the body is read), a
    request without the token when one is set, or with a foreign `Host` when none is. An
    admitted request carries its `tokens.Caller` in its state under `PRINCIPAL_STATE`."""

    def __init__(
        self, app: ASGIApp, *, authenticator: Authenticator, allowed_hosts: Iterable[str] = ()
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.allowed_hosts = LOOPBACK_HOSTS | {name.lower() for name in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        principal: tokens.Caller | None = None
        if self.authenticator.required:
            header = _header(scope, b"authorization")
            scheme, _, presented = (header or b"").strip().partition(b" ")
            principal = (
                self.authenticator.check_bootstrap(presented.strip())
                if scheme.lower() == b"bearer"
                else None
            )
            if principal is None and path == METRICS_PATH and scheme.lower() == b"bearer":
                principal = self.authenticator.check_metrics(presented.strip())
            if principal is None and header is not None:
                # A named token: a database read, off the event loop.
                found = await anyio.to_thread.run_sync(self.authenticator.check_header, header)
                if isinstance(found, tokens.Caller):
                    principal = found
                elif not _is_open(path):
                    await _refusal(path, 401, found.reason)(scope, receive, send)
                    return
            if principal is None and not _is_open(path):
                await _refusal(path, 401, TOKEN_REFUSED)(scope, receive, send)
                return
        else:
            host = host_name(_header(scope, b"host"))
            if host not in self.allowed_hosts:
                await _refusal(path, 403, _host_message(host))(scope, receive, send)
                return
            principal = LOCAL
        scope.setdefault("state", {})[PRINCIPAL_STATE] = principal
        await self.app(scope, receive, send)


def document_token(schema: dict[str, Any]) -> dict[str, Any]:
    """Say in an OpenAPI document that every operation but the open ones needs the bearer
    token (for a server that has one); edits and returns `schema`."""
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "The server's token (`cohabit serve --token` or COHABIT_API_TOKEN).",
    }
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            operation["security"] = [] if _is_open(path) else [{BEARER_SCHEME: []}]
    return schema


def host_name(header: bytes | None) -> str:
    """The name a `Host` header value carries, lower-cased, without its port or IPv6
    brackets: `[::1]:8420` → `::1`; "" when absent or not ASCII."""
    try:
        value = (header or b"").decode("ascii").strip().lower()
    except UnicodeDecodeError:
        return ""
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a header (as Starlette's `Headers` reads it); names are lower-case."""
    return next((value for key, value in scope["headers"] if key == name), None)


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


TOKEN_REFUSED = "missing or wrong bearer token (send 'Authorization: Bearer <token>')"


def _host_message(host: str) -> str:
    shown = repr(host) if host else "no Host header"
    return (
        f"Host {shown} is refused: without an API token this server answers only "
        "127.0.0.1, localhost and [::1] (allow other names with --allow-host)"
    )


def _refusal(path: str, status_code: int, message: str) -> JSONResponse:
    """`{"detail": message}` on the API, an OpenAI error on the gateway's paths."""
    headers = {"WWW-Authenticate": "Bearer"} if status_code == 401 else None
    if path.startswith(GATEWAY_PREFIXES) or path == OPENAI_PREFIX:  # the OpenAI way
        code = "invalid_api_key" if status_code == 401 else "host_not_allowed"
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
        return JSONResponse({"error": error}, status_code=status_code, headers=headers)
    return JSONResponse({"detail": message}, status_code=status_code, headers=headers)
