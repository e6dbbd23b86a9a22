"""The FastAPI app factory, and the one place the rooms are wired together (docs/design.md).
Nothing is built at import time: `create_app(settings, backend)` returns an app whose lifespan
opens and migrates the database, records the fleet, and runs the reconciler, the meter, the
retention purge, the downloads and the gateway. `cohabit serve` and the tests call it."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from cohabit import __version__
from cohabit.hardware.model import Fleet
from cohabit.runtime.interface import EngineRuntime
from cohabit.service.access.guard import AccessGuard, Authenticator, document_token
from cohabit.service.api import (
    auth,
    cluster,
    hub,
    memory,
    metrics,
    model_configs,
    model_files,
    models,
    placement,
    serving,
    ui,
)
from cohabit.service.api.limits import BodyLimits, document_body_limits
from cohabit.service.context import ServiceContext
from cohabit.service.control.autoscale import ScalePolicy
from cohabit.service.control.overbudget import OverBudget
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.control.retention import DAY_S, Retention
from cohabit.service.errors import (
    Conflict,
    HubAnswerRefused,
    InvalidInput,
    NeverFits,
    NotFound,
    ServiceError,
)
from cohabit.service.gateway import proxy as gateway
from cohabit.service.paths import API_PREFIX
from cohabit.service.registry.downloads import Downloader
from cohabit.service.settings import Settings
from cohabit.service.telemetry.activity import Activity
from cohabit.service.telemetry.meter import Measure, Meter, measure_here
from cohabit.service.telemetry.metrics import ServerMetrics, StateCollector
from cohabit.store import ledger
from cohabit.store.database import Database
from cohabit.store.errors import DatabaseUnavailable

SHUTDOWN_S = 60.0  # how long shutdown waits for a background pass to end (they take ms)


def open_database(settings: Settings, fleet: Fleet) -> Database:
    """Open, migrate, and record the fleet placement will see. Raises DatabaseUnavailable."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    db.migrate()
    ledger.save_fleet(db, fleet)
    return db


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """Where engines run and what the fleet is: what `cohabit serve --backend` chooses (the
    local runtime on this machine's fleet, or ModelDeployments on a cluster) and tests hand in.

    `fleet` is stored at startup; `fleet_source`, when given (a cluster), is re-read by the
    reconciler every `fleet_refresh_s`. `budget_unit_bytes`: see `Reconciler`. `stop_engines`
    (the local runtime's `stop_all`) runs on shutdown. `measure` reads live memory for the
    meter (default: this machine's node of the fleet; on Kubernetes, the node agents'
    reports; None: no meter)."""

    runtime: EngineRuntime
    fleet: Fleet
    fleet_source: Callable[[], Fleet] | None = None
    fleet_refresh_s: float = 5.0
    budget_unit_bytes: int = 1
    stop_engines: Callable[[], None] | None = None
    measure: Measure | None = measure_here
    # How `POST /cluster/refresh_hardware` reads the fleet again (this machine's discovery,
    # the fleet file, the cluster); None: the fleet was handed in and there is nothing to read.
    rediscover: Callable[[], Fleet] | None = None


def create_app(
    settings: Settings,
    backend: Backend,
    *,
    reconciler_owner: str | None = None,
    freeze_startup: bool = False,
) -> FastAPI:
    """`reconciler_owner` names this server's reconciler in the leases (tests that run several
    against one database name them).

    `freeze_startup` (the server's own process, `cohabit serve`): once started, what the
    process holds is moved out of the cyclic garbage collector's way (`gc.freeze`). It lives
    as long as the server, and a full collection walking it (modules, SQLAlchemy, FastAPI and
    pydantic: 50–120 ms on two cores) stalled every request in flight and was the list's p99.
    Not for apps made and dropped in one process (tests): frozen objects are never collected.

    On shutdown the reconciler stops, `stop_engines` (when given: the local runtime's
    `stop_all`) stops every engine this server started, and the server lets go of its
    deployments; they stay as they are in the store, so the next start re-adopts engines
    left running or starts them again inside the budgets they still hold.
    """

    authenticator = Authenticator(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = open_database(settings, backend.fleet)
        authenticator.database = db
        runtime, measure = backend.runtime, backend.measure
        activity = Activity()
        exported = ServerMetrics()
        tolerance = settings.over_budget_tolerance_fraction
        # The meter stops or restarts engines over their budget through the reconciler, and
        # the reconciler plans on the meter's figures: each is handed the other's method.
        meter = Meter(
            db,
            measure=measure or (lambda _fleet: ()),
            interval_s=settings.meter_interval_s if measure is not None else 0,
            headroom_bytes=settings.memory_headroom_bytes,
            tolerance_fraction=tolerance,
            on_over_budget=OverBudget(
                db,
                runtime,
                restart=lambda deployment_id: reconciler.restart(deployment_id),
                tolerance_fraction=tolerance,
            ),
        )
        reconciler = Reconciler(
            db,
            runtime,
            poll_interval_s=settings.poll_interval_s,
            lease_s=settings.lease_s,
            owner=reconciler_owner,
            fleet_source=backend.fleet_source,
            fleet_refresh_s=backend.fleet_refresh_s,
            budget_unit_bytes=backend.budget_unit_bytes,
            activity=activity,
            counters=exported.reconciler,
            measurement=meter.measurement,
            scale_policy=ScalePolicy(
                per_copy=settings.scale_per_copy,
                window_s=settings.scale_window_s,
                cooldown_s=settings.scale_cooldown_s,
            ),
            idle_sleep=settings.idle_sleep,
        )
        downloader = Downloader(db, data_dir=settings.data_dir)
        app.state.context = ServiceContext(
            db=db,
            runtime=runtime,
            reconciler=reconciler,
            settings=settings,
            authenticator=authenticator,
            downloader=downloader,
            activity=activity,
            metrics=exported,
            meter=meter,
            rediscover=backend.rediscover or backend.fleet_source,
        )
        exported.watch(StateCollector(db, activity, meter=meter))
        app.state.gateway = gateway.Gateway(
            db=db, settings=settings, loader=reconciler, activity=activity
        )
        app.state.gateway.start()
        retention = Retention(db, runtime, retention_s=settings.retention_days * DAY_S)
        meter.start()
        reconciler.start()
        retention.start()
        downloader.start()
        if freeze_startup:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            # Each thread ends its pass before the database closes: one still running after
            # `dispose` would keep a connection the pool no longer closes.
            downloader.stop(timeout_s=SHUTDOWN_S)
            retention.stop(timeout_s=SHUTDOWN_S)
            meter.stop(timeout_s=SHUTDOWN_S)
            reconciler.stop(timeout_s=SHUTDOWN_S)
            if backend.stop_engines is not None:
                backend.stop_engines()
            reconciler.let_go()
            await app.state.gateway.aclose()
            db.dispose()

    app = FastAPI(
        title="cohabit",
        version=__version__,
        description="Place many LLMs on shared GPUs: estimate, plan, reserve, serve.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    for router in (
        auth.open_router,
        auth.router,
        auth.admin,
        serving.health_router,
        serving.router,
        hub.router,
        models.router,
        model_configs.router,
        model_files.router,
        cluster.router,
        memory.router,
        placement.router,
    ):
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(metrics.router)  # /metrics, where Prometheus looks
    ui.mount(app)  # the web page at /, its fragments under /ui/
    app.add_exception_handler(ServiceError, _service_error)
    # A database that cannot be read or written (disk full, read-only, unreachable) is the
    # server's fault, not the request's: a 503 that says why, whichever route met it.
    app.add_exception_handler(DatabaseUnavailable, _service_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = document_body_limits(plain_openapi())
            app.openapi_schema = document_token(schema) if authenticator.required else schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign] # FastAPI's documented override
    # /runtime/models/{id}/v1/… and /v1/…, outside /api, past the token check and before
    # the API's routes.
    app.add_middleware(gateway.GatewayRoutes)
    # Every body read whole, within its limits, before the gateway or a route sees it; inside
    # the token check, so a refused caller's body is never read.
    app.add_middleware(
        BodyLimits,
        max_body_bytes=settings.max_body_bytes,
        max_gateway_body_bytes=settings.max_gateway_body_bytes,
    )
    # Outermost: a refused request never reaches a route, and its body is never read.
    app.add_middleware(
        AccessGuard, authenticator=authenticator, allowed_hosts=settings.allowed_hosts
    )
    return app


async def _invalid_request(_request: Request, err: Exception) -> JSONResponse:
    """FastAPI's 422 without echoing the input back: it may hold what JSON cannot carry
    (NaN, lone surrogates) and need not travel twice."""
    errors = err.errors() if isinstance(err, RequestValidationError) else []
    problems = [
        {
            "loc": list(error["loc"]),
            "msg": str(error["msg"]).removeprefix("Value error, "),
            "type": error["type"],
        }
        for error in errors
    ]
    return JSONResponse(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": problems}
    )


async def _service_error(_request: Request, err: Exception) -> JSONResponse:
    if isinstance(err, NeverFits):
        return JSONResponse(status_code=status.HTTP_409_CONFLICT, content={"detail": err.body})
    if isinstance(err, NotFound):
        code = status.HTTP_404_NOT_FOUND
    elif isinstance(err, Conflict):
        code = status.HTTP_409_CONFLICT
    elif isinstance(err, HubAnswerRefused):
        code = status.HTTP_502_BAD_GATEWAY
    elif isinstance(err, InvalidInput):
        problem = {"loc": list(err.loc), "msg": str(err), "type": "invalid_input"}
        return JSONResponse(
            status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": [problem]}
        )
    else:
        code = status.HTTP_503_SERVICE_UNAVAILABLE
    return JSONResponse(status_code=code, content={"detail": str(err)})
