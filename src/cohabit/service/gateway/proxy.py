"""The OpenAI-compatible gateway, outside /api: `/runtime/models/{deployment_id}/v1/...`
reaches that deployment's engine, and `/v1/...` a deployment serving the request's `model`.
Bodies and streams pass through unchanged, chunk by chunk as the engine writes them.

It is a plain ASGI layer that `app.create_app` puts inside the token check
(`service.access.guard.AccessGuard`, which has refused what it must before this runs) and in front
of the API's routes, because each request is one dictionary look-up away from its engine:
no database read (`routing.RouteTable`), no thread hop, no router walk, and a keep-alive
connection pool per engine (`upstream.Upstreams`). A request for a deployment that is active
but has no ready engine asks the reconciler to load it and is held until an engine serves,
at most `Settings.gateway_wait_s`, then answered 503 with `Retry-After`. Every proxied
request is counted in `Activity` (in flight until its answer ends or its caller goes away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from cohabit.service.gateway.intake import (
    ID_CHARS,
    Refusal,
    engine_path,
    method_refused,
    model_of,
    not_an_id,
    read_body,
    sent_path,
    unauthorized,
)
from cohabit.service.gateway.routing import RouteTable, Snapshot, Target
from cohabit.service.gateway.upstream import (
    Answer,
    Headers,
    Unreachable,
    UpstreamError,
    Upstreams,
)
from cohabit.service.paths import OPENAI_PREFIX, RUNTIME_PREFIX
from cohabit.service.settings import Settings
from cohabit.service.telemetry.activity import Activity
from cohabit.store import deployments as store
from cohabit.store.database import Database
from cohabit.store.errors import RecordNotFound
from cohabit.store.records import ENDED, DeploymentStatus

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
# A generation may take minutes between bytes on a busy CPU; the engine bounds it, not us.
READ_TIMEOUT_S = 600.0
# While a request waits for a deployment to serve: how often it looks again when the control
# loop has not woken it (a load it waits for that serves wakes it at once), waking the
# reconciler each time, and what a 503 tells it to wait.
WAIT_POLL_S = 0.2
RETRY_AFTER_S = 5
# An engine that refused a connection is passed over for this long while another engine of
# the deployment (a copy) or of the name serves: until the reconciler notices it is gone.
REFUSED_S = 2.0
# Hop-by-hop headers (RFC 9110 §7.6.1: Connection and the fields it names, Proxy-Connection,
# Keep-Alive, TE, Transfer-Encoding, Upgrade; and Trailer, Proxy-Authenticate and
# Proxy-Authorization, hop-by-hop since RFC 2616 §13.5.1) go neither way, nor does what we
# recompute. The caller's Authorization is cohabit's token and stays here (engines listen
# unauthenticated); the body was read whole, so no `Expect: 100-continue` goes on.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_HOP_BY_HOP_PREFIXES = (b"proxy-",)  # Proxy-Connection, Proxy-Authorization, …
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"authorization", b"expect"}
# An engine's cookies and CORS headers would speak for cohabit's origin, which sets neither
# (docs/api.md#access); uvicorn writes its own Server and Date.
_NOT_RELAYED = _HOP_BY_HOP | {b"server", b"date", b"set-cookie"}
_NOT_RELAYED_PREFIXES = (*_HOP_BY_HOP_PREFIXES, b"access-control-")


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A request's destination: one ready engine of one deployment."""

    deployment_id: str
    base_url: str
    # The load this request was held for: its hold ends once the request counts as in
    # flight, so a scale-to-zero deployment never looks idle in between.
    held_for: str | None = None


# Segments before the engine path: "", the prefix's own, the id and "v1".
_DEPLOYMENT_PREFIX_SEGMENTS = RUNTIME_PREFIX.count("/") + 3
_MODEL_PREFIX_SEGMENTS = 2  # "", "v1"
_RUNTIME_START = RUNTIME_PREFIX + "/"
_OPENAI_START = OPENAI_PREFIX + "/"


class GatewayRoutes:
    """The ASGI layer: serves the gateway's paths with the app's `Gateway`
    (`app.state.gateway`, made in the lifespan) and hands every other request on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith(_OPENAI_START):
                gateway: Gateway | None = getattr(scope["app"].state, "gateway", None)
                if gateway is not None:
                    await gateway.by_name(scope, receive, send)
                    return
            elif path.startswith(_RUNTIME_START):
                parts = path.split("/", _DEPLOYMENT_PREFIX_SEGMENTS)
                gateway = getattr(scope["app"].state, "gateway", None)
                if len(parts) > _DEPLOYMENT_PREFIX_SEGMENTS and parts[-2] == "v1" and gateway:
                    await gateway.by_deployment(parts[-3], scope, receive, send)
                    return
        await self.app(scope, receive, send)


class Loader(Protocol):
    """What the gateway asks of the control loop (the reconciler answers it): start loading a
    deployment that has no engine serving (True when a load is now on its way; concurrent
    callers start one between them), and look at the deployments again soon."""

    def load(self, deployment_id: str) -> bool: ...

    def wake(self) -> None: ...


class Gateway:
    """One app's gateway: the route table, the engine connections, the requests in flight
    per engine (to pick the least busy of a deployment's engines) and the loads asked for."""

    def __init__(
        self, *, db: Database, settings: Settings, loader: Loader, activity: Activity
    ) -> None:
        self.db = db
        self.loader = loader
        self.activity = activity
        self.table = RouteTable(db, refresh_s=settings.route_refresh_s, settled=activity.settle)
        self.upstreams = Upstreams(
            connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S
        )
        self.wait_s = settings.gateway_wait_s
        self.in_flight: dict[str, int] = {}  # engine base URL → requests
        self.refused: dict[str, float] = {}  # engine base URL → when it refused a connection
        self._refresher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._refresher = asyncio.get_running_loop().create_task(self.table.keep_current())

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        await self.upstreams.aclose()

    # --- the two routes --------------------------------------------------------------

    async def by_deployment(
        self, deployment_id: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Any OpenAI route of one deployment's engine (chat/completions, completions, models…)."""
        arrived = time.monotonic()
        refused = unauthorized(scope) or method_refused(scope, ("GET", "POST"))
        target = refused or engine_path(
            sent_path(scope), prefix_segments=_DEPLOYMENT_PREFIX_SEGMENTS
        )
        if isinstance(target, Refusal):
            await target.response()(scope, receive, send)
            return
        body = await read_body(receive)

        async def resolve() -> Route | Refusal:
            return await self.route_to_deployment(deployment_id, arrived)

        await self.forward(scope, receive, send, resolve, target, body, arrived)

    async def by_name(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An OpenAI request routed by its `model` field to a deployment serving that name;
        `GET /v1/models` lists the names served."""
        arrived = time.monotonic()
        refused = unauthorized(scope)
        target = refused or engine_path(sent_path(scope), prefix_segments=_MODEL_PREFIX_SEGMENTS)
        if not isinstance(target, Refusal) and scope["method"] == "GET" and target == "/v1/models":
            await self.list_models(arrived)(scope, receive, send)
            return
        target = (
            target if isinstance(target, Refusal) else method_refused(scope, ("POST",)) or target
        )
        if isinstance(target, Refusal):
            await target.response()(scope, receive, send)
            return
        body = await read_body(receive)
        model = model_of(body)
        if isinstance(model, Refusal):
            await model.response()(scope, receive, send)
            return

        async def resolve() -> Route | Refusal:
            return await self.route_to_model(model, arrived)

        await self.forward(scope, receive, send, resolve, target, body, arrived)

    def list_models(self, arrived: float) -> Any:
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                snapshot = await self.table.fresh(arrived)
            except Exception as err:
                await _unavailable(err).response()(scope, receive, send)
                return
            names: dict[str, Target] = {}
            for target in snapshot.by_id.values():
                if target.status is DeploymentStatus.DEPLOYED:
                    names.setdefault(target.model_name, target)
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": int(t.since.timestamp()),
                    "owned_by": "cohabit",
                }
                for name, t in sorted(names.items())
            ]
            await JSONResponse({"object": "list", "data": data})(scope, receive, send)

        return answer

    # --- routing ---------------------------------------------------------------------

    async def route_to_deployment(self, deployment_id: str, arrived: float) -> Route | Refusal:
        if not_an_id(deployment_id):
            return _no_deployment(deployment_id[:ID_CHARS])  # not an id any store could hold
        try:
            target = self.table.snapshot.by_id.get(deployment_id)
            if target is None:  # created a moment ago, ended, or never: read again first
                target = (await self.table.fresh(arrived)).by_id.get(deployment_id)
            ready = self._serving(() if target is None else (target,))
            if ready:
                return self._pick(ready)
            refusal = await self._not_in_table(deployment_id) if target is None else None
            if refusal is not None:
                return refusal

            def candidates(snapshot: Snapshot) -> tuple[Target, ...] | None:
                found = snapshot.by_id.get(deployment_id)
                return None if found is None else (found,)

            return await self._held(
                deployment_id, f"deployment {deployment_id}", candidates, arrived
            )
        except Exception as err:  # the database unreachable while the table is read
            return _unavailable(err)

    async def route_to_model(self, model: str, arrived: float) -> Route | Refusal:
        """A ready engine of a deployment whose served name (or id) is `model`, the least
        busy one (the first deployed among equals); when none is ready, one is loaded —
        one already starting if there is one, else the first deployed — and the request
        held until any of them serves."""
        try:
            serving = self.table.snapshot.by_name.get(model)
            if not serving:
                serving = (await self.table.fresh(arrived)).by_name.get(model)
            if not serving:
                return Refusal(
                    status_code=404,
                    code="model_not_found",
                    message=f"the model {model!r} is not deployed here (GET /v1/models lists them)",
                )
            ready = self._serving(serving)
            if ready:
                return self._pick(ready)
            chosen = next((t for t in serving if t.starting), serving[0])

            def candidates(snapshot: Snapshot) -> tuple[Target, ...] | None:
                return snapshot.by_name.get(model) or None

            return await self._held(chosen.deployment_id, f"model {model!r}", candidates, arrived)
        except Exception as err:
            return _unavailable(err)

    def _serving(self, targets: tuple[Target, ...]) -> tuple[Target, ...]:
        """Those of `targets` with a ready engine, less the engines this process's control
        loop is stopping (unloaded or stopped a moment ago, which the table may not show yet:
        a request sent there would meet an engine shutting down)."""
        withdrawn = self.activity.withdrawn()
        ready = []
        for target in targets:
            engines = target.engines
            if withdrawn and engines:
                gone = target.deployment_id in withdrawn
                engines = () if gone else tuple(e for e in engines if e not in withdrawn)
            if engines:
                same = engines == target.engines
                ready.append(target if same else replace(target, engines=engines))
        return tuple(ready)

    def _pick(self, targets: tuple[Target, ...]) -> Route:
        """The least busy ready engine of `targets`, passing over one that refused a
        connection in the last `REFUSED_S` while another is there."""
        avoid: frozenset[str] = frozenset()
        if self.refused:
            now = time.monotonic()
            for url, at in list(self.refused.items()):
                if now - at > REFUSED_S:
                    del self.refused[url]
            avoid = frozenset(self.refused)
        return least_busy(targets, self.in_flight, avoid=avoid)

    async def _not_in_table(self, deployment_id: str) -> Refusal | None:
        """A deployment the (fresh) table does not hold: unknown (404), ended (503 saying
        so), or None when it is neither (a state this gateway does not list, to load)."""
        try:
            record = await asyncio.to_thread(store.get, self.db, deployment_id)
        except RecordNotFound:
            return _no_deployment(deployment_id)
        if record.status in ENDED:
            return _not_ready(f"deployment {deployment_id}", record.status.value)
        return None

    async def _held(
        self,
        load_id: str,
        what: str,
        candidates: Callable[[Snapshot], tuple[Target, ...] | None],
        arrived: float,
    ) -> Route | Refusal:
        """Ask the reconciler to load `load_id` (once for all the requests held for it) and
        hold this request until one of `candidates` has a ready engine, or the wait is up."""
        loader = self.loader
        asked = datetime.now(UTC)  # a load that finds no room from now on answers at once
        loop = asyncio.get_running_loop()
        served = asyncio.Event()

        def wake() -> None:  # from the control loop's thread
            loop.call_soon_threadsafe(served.set)

        self.activity.watch(load_id, wake)
        first = self.activity.hold(load_id)
        routed = False
        try:
            if first:
                await asyncio.to_thread(loader.load, load_id)
            deadline = arrived + self.wait_s
            states = "not serving"
            looked = False  # the answer names the states of one look at least, however late
            while True:
                loader.wake()
                left = deadline - time.monotonic()
                if left <= 0 and looked:
                    return _not_ready(what, states, waited_s=self.wait_s)
                if left > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(served.wait(), min(WAIT_POLL_S, left))
                # Woken by the load serving: the table as of now; else as of one poll ago.
                newer_than = time.monotonic() - (0.0 if served.is_set() else WAIT_POLL_S)
                served.clear()
                looked = True
                found = candidates(await self.table.fresh(newer_than))
                if found is None:
                    ended = await self._not_in_table(load_id)
                    if ended is not None:
                        return ended
                    continue
                ready = self._serving(found)
                if ready:
                    routed = True
                    return replace(self._pick(ready), held_for=load_id)
                refused = _load_refused(found, load_id, asked)
                if refused is not None:
                    return _no_room(what, refused)
                states = ", ".join(sorted({t.status.value for t in found}))
        finally:
            self.activity.unwatch(load_id, wake)
            if not routed:
                self.activity.release(load_id)

    # --- forwarding ------------------------------------------------------------------

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        resolve: Callable[[], Any],
        path: str,
        body: bytes,
        arrived: float,
    ) -> None:
        """Route, send the request to the engine's `path` (from `engine_path`) and relay its
        answer as it arrives. An engine that refuses the connection may be one stopped a
        moment ago: the table is read again and the request routed once more, or answered
        what a request arriving now would be (503 for a deployment that has ended)."""
        route: Route | Refusal = await resolve()
        if isinstance(route, Refusal):
            await route.response()(scope, receive, send)
            return
        headers = end_to_end(scope["headers"], _NOT_FORWARDED, _HOP_BY_HOP_PREFIXES)
        query = scope.get("query_string")
        target = f"{path}?{query.decode('latin-1')}" if query else path
        activity = self.activity
        activity.begin(route.deployment_id)
        held_for = route.held_for  # the load it waited for: its first answer is timed
        if held_for is not None:
            activity.release(held_for)
        engine = route.base_url
        self.in_flight[engine] = self.in_flight.get(engine, 0) + 1
        tokens = _Tokens() if path.endswith("completions") else None
        ok = False
        try:
            try:
                answer = await self.upstreams.send(engine, scope["method"], target, headers, body)
            except Unreachable:
                self.refused[engine] = time.monotonic()
                await self.table.fresh(time.monotonic())
                again = await resolve()
                if isinstance(again, Refusal):  # stopped a moment ago: say so, as a new request
                    await again.response()(scope, receive, send)
                    return
                if again.held_for is not None:  # this request counts in flight already
                    activity.release(again.held_for)
                    held_for = again.held_for
                if again.base_url == engine:
                    raise
                answer = await self.upstreams.send(
                    again.base_url, scope["method"], target, headers, body
                )
            if held_for is not None:  # its status line and headers are here: the first byte
                activity.answered(held_for)
            ok = await _relay(answer, scope, receive, send, tokens)
        except UpstreamError as err:
            log.warning("deployment %s: %s", route.deployment_id, err)
            await Refusal(
                status_code=502,
                code="engine_unreachable",
                message=f"the engine of deployment {route.deployment_id} gave no usable "
                f"answer: {err}",
                type="server_error",
            ).response()(scope, receive, send)
        finally:
            self.in_flight[engine] -= 1
            activity.finish(
                route.deployment_id,
                seconds=time.monotonic() - arrived,
                ok=ok,
                completion_tokens=None if tokens is None else tokens.count,
            )


def least_busy(
    targets: tuple[Target, ...], in_flight: dict[str, int], *, avoid: frozenset[str] = frozenset()
) -> Route:
    """The ready engine of `targets` with the fewest requests in flight (`in_flight`: base
    URL → requests), the first listed among equals: copies of one deployment share its
    load, and deployments of one name too. Engines in `avoid` are taken only when there is
    no other."""
    best: Route | None = None
    key = (True, 0)
    for target in targets:
        for base_url in target.engines:
            candidate = (base_url in avoid, in_flight.get(base_url, 0))
            if best is None or candidate < key:
                best, key = Route(deployment_id=target.deployment_id, base_url=base_url), candidate
    if best is None:
        raise ValueError("no target has a ready engine")
    return best


def end_to_end(headers: Headers, dropped: frozenset[bytes], prefixes: tuple[bytes, ...]) -> Headers:
    """`headers` (lower-case names) less those `dropped`, those starting with one of
    `prefixes`, and those a Connection header names (RFC 9110 §7.6.1)."""
    for name, value in headers:
        if name == b"connection":
            named = {token.strip().lower() for token in value.split(b",")}
            if not named <= dropped:  # usually just "keep-alive" or "close"
                dropped = dropped | named
    return [
        (name, value)
        for name, value in headers
        if name not in dropped and not name.startswith(prefixes)
    ]


async def _relay(
    answer: Answer, scope: Scope, receive: Receive, send: Send, tokens: _Tokens | None
) -> bool:
    """Relay an engine's answer; True when it went out whole and was not a 5xx. The caller
    going away ends it (the engine's connection is closed, so it stops generating)."""
    headers = end_to_end(answer.headers, _NOT_RELAYED, _NOT_RELAYED_PREFIXES)
    start = {"type": "http.response.start", "status": answer.status, "headers": headers}
    if answer.whole is not None:  # read already, its connection back in the pool
        if tokens is not None:
            tokens.feed(answer.whole)
        await send(start)
        await send({"type": "http.response.body", "body": answer.whole, "more_body": False})
        return bool(answer.status < 500)
    main = asyncio.current_task()
    state = {"relaying": True, "gone": False}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if state["relaying"] and main is not None:
            state["gone"] = True
            main.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        await send(start)
        async for piece in answer.body(READ_TIMEOUT_S):
            if tokens is not None:
                tokens.feed(piece)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        state["relaying"] = False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return bool(answer.status < 500)
    except asyncio.CancelledError:
        answer.release()  # the engine's connection closed now, not when the body is collected
        if not state["gone"] or main is None:
            raise  # cancelled from outside: a shutdown's deadline cutting a stream short
        main.uncancel()
        return False
    except UpstreamError as err:  # the answer started: all we can do is end it short
        log.warning("an engine's answer broke off: %s", err)
        return False
    finally:
        state["relaying"] = False
        watcher.cancel()


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_TAIL = 64  # bytes kept from one piece to the next: a field split across two is still found


class _Tokens:
    """The generated tokens an answer reports: the last `"completion_tokens": N` in its
    body (the `usage` of a JSON answer, or of the last SSE chunk that carries one), found
    without parsing the body."""

    __slots__ = ("_tail", "count")

    def __init__(self) -> None:
        self.count: int | None = None
        self._tail = b""

    def feed(self, piece: bytes) -> None:
        window = self._tail + piece
        if b"completion_tokens" in window:
            for match in _COMPLETION_TOKENS.finditer(window):
                self.count = int(match.group(1))
        self._tail = window[-_TAIL:]


def _load_refused(found: tuple[Target, ...], load_id: str, asked: datetime) -> str | None:
    """The NoFit of the load a held request waits for, when it found no room after the
    request was held and nothing else of `found` is on its way to serving."""
    if any(t.starting for t in found):
        return None
    loaded = next((t for t in found if t.deployment_id == load_id), None)
    if loaded is None or loaded.no_room is None or loaded.no_room[0] < asked:
        return None
    return loaded.no_room[1]


def _no_room(what: str, no_fit: str) -> Refusal:
    return Refusal(
        status_code=503,
        code="no_room_to_load",
        message=f"{what} could not be loaded: {no_fit}",
        type="server_error",
        retry_after_s=RETRY_AFTER_S,
    )


def _not_ready(what: str, states: str, *, waited_s: float | None = None) -> Refusal:
    if waited_s is None:
        return Refusal(
            status_code=503,
            code="deployment_not_ready",
            message=f"{what} is not ready to serve ({states}); retry once it is DEPLOYED",
            type="server_error",
        )
    return Refusal(
        status_code=503,
        code="deployment_not_ready",
        message=f"{what} is not ready to serve ({states}) after waiting {waited_s:g} s; "
        f"retry in a while",
        type="server_error",
        retry_after_s=RETRY_AFTER_S,
    )


def _no_deployment(deployment_id: str) -> Refusal:
    return Refusal(
        status_code=404, code="deployment_not_found", message=f"no deployment {deployment_id!r}"
    )


def _unavailable(err: Exception) -> Refusal:
    log.error("the gateway cannot read its routes: %r", err)
    return Refusal(
        status_code=503,
        code="routes_unavailable",
        message="the gateway cannot read its routes (the database did not answer); retry",
        type="server_error",
        retry_after_s=RETRY_AFTER_S,
    )
