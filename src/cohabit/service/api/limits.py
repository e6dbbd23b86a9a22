"""Request bodies at the HTTP edge: `BodyLimits`, the ASGI middleware `app.create_app` puts
just inside the token check, reads every request body before any route does and hands it on
whole, or answers for it: 413 when it is larger than its route takes (from Content-Length
before a byte is read, else as soon as the streamed bytes pass the limit), and 400 when a
JSON body nests deeper than `json_depth.JSON_DEPTH_LIMIT` (the gateway's by-name route, which
parses any body to find its `model`, checks again there). How long a body may take is the
connection's business (service/httpserver.py: one timer, armed only for a late body).

FastAPI's own `max_body_size` (fastapi/_body_limit.py over starlette/middleware/body_limit.py,
in recent releases only) answers a plain-text 413 and has one limit for the API and the
gateway (an ASGI layer, not a route that could carry its own); hence this layer."""

from __future__ import annotations

import enum
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cohabit.service.gateway.intake import Refusal
from cohabit.service.json_depth import depth_over, too_deep_message
from cohabit.service.paths import GATEWAY_PREFIXES
from cohabit.units import MIB

# Sent with an answer given before the body was read whole: the rest of it is not read, so
# the connection cannot carry another request (uvicorn closes it after the answer).
_CLOSE = {"Connection": "close"}


class BodyLimits:
    """The ASGI middleware: `max_body_bytes` for /api (and every path outside the gateway),
    `max_gateway_body_bytes` for the gateway's `/v1/…` and `/runtime/models/…`; a request
    that announces no body (neither Content-Length nor Transfer-Encoding) passes untouched."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_gateway_body_bytes: int,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_gateway_body_bytes = max_gateway_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: bytes | None = None
        streamed = False
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                streamed = True
            elif name == b"content-type":
                content_type = value
        if length is None and not streamed:
            await self.app(scope, receive, send)
            return
        gateway = scope["path"].startswith(GATEWAY_PREFIXES)
        limit = self.max_gateway_body_bytes if gateway else self.max_body_bytes
        if length is not None and length.strip().isdigit() and int(length) > limit:
            await _too_large(gateway, limit)(scope, receive, send)
            return
        body = await _read(receive, limit)
        if body is _Unread.TOO_LARGE:
            await _too_large(gateway, limit)(scope, receive, send)
            return
        if body is _Unread.GONE:
            return  # the caller left: there is no one to answer
        if _is_json(content_type):
            depth = depth_over(body)
            if depth is not None:
                message = too_deep_message(depth)
                refusal = _refusal(gateway, 400, "json_too_deep", message, close=False)
                await refusal(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)


class _Unread(enum.Enum):
    """Why a body was not read whole."""

    TOO_LARGE = "more than the limit came (the rest is left unread)"
    GONE = "the caller disconnected first"


async def _read(receive: Receive, limit: int) -> bytes | _Unread:
    """The whole body, or why it was not read whole."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _Unread.GONE
        part: bytes = message.get("body", b"")
        size += len(part)
        if size > limit:
            return _Unread.TOO_LARGE
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app the body read, in one message, then the caller's own
    messages (a disconnect, which the gateway watches for while it streams)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _is_json(content_type: bytes) -> bool:
    """Whether a body of this type is read as JSON: the rule of fastapi/routing.py, an
    `application/json` or `application/…+json` type, or none (FastAPI before its strict
    content type, the login route) — which engines behind the gateway follow too."""
    mime = content_type.partition(b";")[0].strip().lower()
    return (
        not mime
        or mime == b"application/json"
        or (mime.startswith(b"application/") and mime.endswith(b"+json"))
    )


def _too_large(gateway: bool, limit: int) -> Response:
    message = (
        f"the request body is larger than {limit} bytes ({limit / MIB:g} MiB), the most "
        f"{'the gateway' if gateway else 'this route'} accepts"
    )
    return _refusal(gateway, 413, "body_too_large", message, close=True)


def _refusal(gateway: bool, status_code: int, code: str, message: str, *, close: bool) -> Response:
    """`{"detail": message}` on the API, an OpenAI error on the gateway's paths; with
    `close`, the connection closes after it (the body was not read whole)."""
    if gateway:
        response = Refusal(status_code=status_code, code=code, message=message).response()
        if close:
            response.headers.update(_CLOSE)
        return response
    return JSONResponse(
        {"detail": message}, status_code=status_code, headers=_CLOSE if close else None
    )


_BODY_METHODS = frozenset({"post", "put", "patch"})
_ERROR_MESSAGE = {"$ref": "#/components/schemas/ErrorMessage"}


def document_body_limits(schema: dict[str, Any]) -> dict[str, Any]:
    """Say in an OpenAPI document that every operation taking a body may answer 408 and 413
    (the body's depth is one of a 400's reasons, which those with a JSON body list already);
    edits and returns `schema`."""
    answers = {
        "408": "The body did not arrive within the server's body timeout.",
        "413": "The body is larger than the server accepts on this route.",
    }
    for operations in schema.get("paths", {}).values():
        for method, operation in operations.items():
            if method in _BODY_METHODS:
                responses = operation.setdefault("responses", {})
                for code, description in answers.items():
                    responses.setdefault(
                        code,
                        {
                            "description": description,
                            "content": {"application/json": {"schema": _ERROR_MESSAGE}},
                        },
                    )
    return schema
