"""The OpenAI-compatible gateway, mounted by `app.create_app` outside /api:
`/runtime/models/{deployment_id}/v1/...` reaches that deployment's engine, and `/v1/...` the
DEPLOYED deployment serving the request's `model`. Bodies and streams pass through unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote, unquote

import httpx
from fastapi import APIRouter, Header, HTTPException, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from cohabit.runtime.interface import handle_from_json
from cohabit.service.api.deps import Context, require_token
from cohabit.service.deployments import RUNTIME_PREFIX
from cohabit.store import deployments as store
from cohabit.store.database import Database
from cohabit.store.errors import RecordNotFound
from cohabit.store.records import DeploymentRecord, DeploymentStatus

CONNECT_TIMEOUT_S = 5.0
# A generation may take minutes between bytes on a busy CPU; the engine bounds it, not us.
READ_TIMEOUT_S = 600.0
# Hop-by-hop headers (RFC 9110 §7.6.1) and what httpx/uvicorn recompute; the caller's
# Authorization is cohabit's token and stays here (engines listen on loopback unauthenticated).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "content-length", "authorization"}
_NOT_RELAYED = _HOP_BY_HOP | {"server", "date"}  # uvicorn writes its own

router = APIRouter(tags=["gateway"])
Authorization = Annotated[str | None, Header()]


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A request's destination: the engine's base URL (OpenAI routes under `/v1`)."""

    deployment_id: str
    base_url: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request cannot be routed, as an OpenAI-style error."""

    status_code: int
    code: str
    message: str
    type: str = "invalid_request_error"

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": None, "code": self.code}
        return JSONResponse(status_code=self.status_code, content={"error": error})


def route_to_deployment(db: Database, deployment_id: str) -> Route | Refusal:
    try:
        record = store.get(db, deployment_id)
    except RecordNotFound:
        return Refusal(
            status_code=404,
            code="deployment_not_found",
            message=f"no deployment {deployment_id}",
        )
    return _route(record) or _not_ready([record], f"deployment {deployment_id}")


def route_to_model(db: Database, model: str) -> Route | Refusal:
    """The DEPLOYED deployment whose served name (or id) is `model`; the one deployed first
    when there are several. One indexed query, whatever the number of records."""
    serving = store.serving(db, model)
    deployed = sorted(
        (r for r in serving if r.status is DeploymentStatus.DEPLOYED),
        key=lambda r: (r.deployed_at or r.requested_at, r.id),
    )
    for record in deployed:
        route = _route(record)
        if route is not None:
            return route
    if not serving:
        return Refusal(
            status_code=404,
            code="model_not_found",
            message=f"the model {model!r} is not deployed here (GET /v1/models lists them)",
        )
    return _not_ready(serving, f"model {model!r}")


def deployed_models(db: Database) -> list[dict[str, Any]]:
    """`GET /v1/models`: one entry per served name with a DEPLOYED deployment."""
    names: dict[str, DeploymentRecord] = {}
    for record in store.list_active(db):
        if record.status is DeploymentStatus.DEPLOYED:
            names.setdefault(record.model_name, record)
    return [
        {
            "id": name,
            "object": "model",
            "created": int((record.deployed_at or record.requested_at).timestamp()),
            "owned_by": "cohabit",
        }
        for name, record in sorted(names.items())
    ]


def _route(record: DeploymentRecord) -> Route | None:
    handle = handle_from_json(record.engine_handle)
    if record.status is not DeploymentStatus.DEPLOYED or handle is None or not handle.base_url:
        return None
    return Route(deployment_id=record.id, base_url=handle.base_url.rstrip("/"))


def _not_ready(records: Iterable[DeploymentRecord], what: str) -> Refusal:
    states = ", ".join(sorted({r.status.value for r in records}))
    return Refusal(
        status_code=503,
        code="deployment_not_ready",
        message=f"{what} is not ready to serve ({states}); retry once it is DEPLOYED",
        type="server_error",
    )


async def _authorize(context: Context, authorization: str | None) -> Refusal | None:
    """With a token configured the gateway wants it too: the API's check (a named token is
    looked up in the database, so off the event loop), answered the OpenAI way."""
    try:
        await run_in_threadpool(require_token, context, authorization)
    except HTTPException as err:
        return Refusal(status_code=err.status_code, code="invalid_api_key", message=err.detail)
    return None


# What a forwarded path segment may carry as is (RFC 3986 pchar); the rest is re-encoded.
_SEGMENT_SAFE = "-._~!$&'()*+,;=:@"
_ENCODED_SEPARATOR = re.compile(r"%(?:2f|5c)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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


def _request_engine_path(request: Request, *, prefix_segments: int) -> str | Refusal:
    """`engine_path` of the path as received: ASGI's `raw_path`, else `path` encoded again."""
    raw = request.scope.get("raw_path")
    sent = raw.decode("latin-1") if raw else quote(request.scope["path"], safe="/")
    return engine_path(sent, prefix_segments=prefix_segments)


_DEPLOYMENT_PATH = f"{RUNTIME_PREFIX}/{{deployment_id}}/v1/{{path:path}}"
# Segments before the engine path: "", the prefix's own, the id and "v1".
_DEPLOYMENT_PREFIX_SEGMENTS = RUNTIME_PREFIX.count("/") + 3
_MODEL_PREFIX_SEGMENTS = 2  # "", "v1"


@router.get(_DEPLOYMENT_PATH, operation_id="gateway_deployment_get")
@router.post(_DEPLOYMENT_PATH, operation_id="gateway_deployment_post")
async def deployment_api(
    deployment_id: str,
    path: str,
    request: Request,
    context: Context,
    authorization: Authorization = None,
) -> Response:
    """Any OpenAI route of one deployment's engine (chat/completions, completions, models…)."""
    del path  # the decoded path; the engine gets the one `_request_engine_path` checks
    refused = await _authorize(context, authorization)
    if refused is not None:
        return refused.response()
    target = _request_engine_path(request, prefix_segments=_DEPLOYMENT_PREFIX_SEGMENTS)
    if isinstance(target, Refusal):
        return target.response()
    route = await run_in_threadpool(route_to_deployment, context.db, deployment_id)
    if isinstance(route, Refusal):
        return route.response()
    return await forward(request, route, target, await request.body())


@router.get("/v1/models")
async def list_models(context: Context, authorization: Authorization = None) -> Response:
    refused = await _authorize(context, authorization)
    if refused is not None:
        return refused.response()
    models = await run_in_threadpool(deployed_models, context.db)
    return JSONResponse({"object": "list", "data": models})


@router.post("/v1/{path:path}")
async def model_api(
    path: str, request: Request, context: Context, authorization: Authorization = None
) -> Response:
    """An OpenAI request routed by its `model` field to a deployment serving that name."""
    del path  # as in deployment_api
    refused = await _authorize(context, authorization)
    if refused is not None:
        return refused.response()
    target = _request_engine_path(request, prefix_segments=_MODEL_PREFIX_SEGMENTS)
    if isinstance(target, Refusal):
        return target.response()
    body = await request.body()
    model = _model_of(body)
    if isinstance(model, Refusal):
        return model.response()
    route = await run_in_threadpool(route_to_model, context.db, model)
    if isinstance(route, Refusal):
        return route.response()
    return await forward(request, route, target, body)


def _model_of(body: bytes) -> str | Refusal:
    try:
        parsed = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return Refusal(status_code=400, code="invalid_json", message=f"the body is not JSON: {err}")
    model = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(model, str) or not model:
        return Refusal(
            status_code=400,
            code="missing_model",
            message="the body needs a 'model' field naming a deployed model",
        )
    return model


def engine_client() -> httpx.AsyncClient:
    """The one client the gateway reaches engines with: the app opens it at start and closes
    it at shutdown, so connections to an engine are pooled across requests. Engines are on
    this host or the cluster network, never behind a proxy, so the environment is ignored."""
    return httpx.AsyncClient(
        trust_env=False,
        timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


async def forward(request: Request, route: Route, path: str, body: bytes) -> Response:
    """Send the request to the engine's `path` (from `engine_path`) and relay its answer as
    it arrives (SSE included)."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
    query = request.url.query
    url = f"{route.base_url}{path}" + (f"?{query}" if query else "")
    client: httpx.AsyncClient = request.app.state.engine_client
    upstream_request = client.build_request(request.method, url, headers=headers, content=body)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.TransportError as err:
        return Refusal(
            status_code=502,
            code="engine_unreachable",
            message=f"the engine of deployment {route.deployment_id} did not answer: {err!r}",
            type="server_error",
        ).response()

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()

    kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_RELAYED}
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
