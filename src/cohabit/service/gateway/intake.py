"""What the gateway (service/gateway/proxy.py) accepts of a request before routing it: the caller
admitted by the token check, the method, the engine path under `/v1/` (normalised, never
leaving it), the body's `model`; and its refusals, answered the OpenAI way."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope

from cohabit.service.access.guard import PRINCIPAL_STATE, TOKEN_REFUSED
from cohabit.service.json_depth import depth_over, too_deep_message

ID_CHARS = 64  # a deployment id is a UUID; anything longer is refused unread


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request cannot be routed, as an OpenAI-style error."""

    status_code: int
    code: str
    message: str
    type: str = "invalid_request_error"
    retry_after_s: int | None = None

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": None, "code": self.code}
        headers = None if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}
        return JSONResponse(status_code=self.status_code, content={"error": error}, headers=headers)


# What a forwarded path segment may carry as is (RFC 3986 pchar); the rest is re-encoded.
_SEGMENT_SAFE = "-._~!$&'()*+,;=:@"
_ENCODED_SEPARATOR = re.compile(r"%(?:2f|5c)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# Clients send the same few paths again and again, and the answer (a str or a frozen
# Refusal) depends on the path alone: kept, it is a look-up instead of decoding and encoding
# every segment again on each request.
@lru_cache(maxsize=4096)
def engine_path(raw_path: str, *, prefix_segments: int) -> str | Refusal:
    """The engine route a request goes to, always under `/v1/`: the request's path as it was
    sent (still percent-encoded) less the gateway's own first `prefix_segments` segments
    (up to and including its `v1`), each segment decoded once, dot segments resolved
    (RFC 3986 §5.2.4) and the rest encoded again.

    Refused (400): a backslash or an encoded `/` or `\\` (the engine's router could split
    the path where we did not), control characters, bytes that are not percent-encoded
    UTF-8, and any path that climbs out of `/v1/`: the engine's other routes (its OpenAPI
    document, metrics, admin endpoints) are not the gateway's to reach.
    """
    path = raw_path.partition("?")[0]
    if "\\" in path or _ENCODED_SEPARATOR.search(path):
        return _bad_path("an encoded '/' or a '\\' in the path is not accepted")
    if not path.isascii():
        return _bad_path("the path must be ASCII, with other characters percent-encoded")
    kept: list[str] = []
    for segment in path.split("/")[prefix_segments:]:
        try:
            decoded = unquote(segment, errors="strict")
        except UnicodeDecodeError:
            return _bad_path("the path's percent-encoded bytes are not UTF-8")
        if _CONTROL.search(decoded):
            return _bad_path("the path holds control characters")
        if decoded == ".":
            continue
        if decoded == "..":
            if not kept:
                return _bad_path("the path leaves /v1/; only the engine's /v1 routes are served")
            kept.pop()
            continue
        kept.append(quote(decoded, safe=_SEGMENT_SAFE))
    return "/v1/" + "/".join(kept)


def _bad_path(message: str) -> Refusal:
    return Refusal(status_code=400, code="invalid_path", message=message)


def sent_path(scope: Scope) -> str:
    """The path as received: ASGI's `raw_path`, else `path` encoded again."""
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if raw else quote(scope["path"], safe="/")


def unauthorized(scope: Scope) -> Refusal | None:
    """The guard admits a request by putting its caller in the state; none: it did not run."""
    if scope.get("state", {}).get(PRINCIPAL_STATE) is None:
        return Refusal(status_code=401, code="invalid_api_key", message=TOKEN_REFUSED)
    return None


def method_refused(scope: Scope, allowed: tuple[str, ...]) -> Refusal | None:
    if scope["method"] in allowed:
        return None
    return Refusal(
        status_code=405,
        code="method_not_allowed",
        message=f"{scope['method']} is not served here (use {' or '.join(allowed)})",
    )


async def read_body(receive: Receive) -> bytes:
    message: Message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


def model_of(body: bytes) -> str | Refusal:
    """The body's `model`, read by parsing it: a body nested too deep for that is refused
    first, as one that is not JSON (a number past Python's 4300 digits is a ValueError too)."""
    depth = depth_over(body)
    if depth is not None:
        return Refusal(status_code=400, code="json_too_deep", message=too_deep_message(depth))
    try:
        parsed = json.loads(body or b"null")
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, int digits
        return Refusal(status_code=400, code="invalid_json", message=f"the body is not JSON: {err}")
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or not model:
        return Refusal(
            status_code=400,
            code="missing_model",
            message="the body needs a 'model' field naming a deployed model",
        )
    return model


def not_an_id(deployment_id: str) -> bool:
    """Whether `deployment_id` is something no store could hold (too long, control bytes)."""
    return len(deployment_id) > ID_CHARS or bool(_CONTROL.search(deployment_id))
