"""What a running server holds, shared by its routers: the database, the engine runtime, the
reconciler, the settings and the token checker. Built in `app.create_app`'s lifespan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cohabit.hardware.model import Fleet
from cohabit.runtime.interface import EngineRuntime
from cohabit.service.access.guard import Authenticator
from cohabit.service.control.reconciler import Reconciler
from cohabit.service.registry.downloads import Downloader
from cohabit.service.settings import Settings
from cohabit.service.telemetry.activity import Activity
from cohabit.service.telemetry.meter import Meter
from cohabit.service.telemetry.metrics import ServerMetrics
from cohabit.store.database import Database


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceContext:
    db: Database
    runtime: EngineRuntime
    reconciler: Reconciler
    settings: Settings
    authenticator: Authenticator
    downloader: Downloader
    activity: Activity  # the gateway's per-deployment traffic, shared with the reconciler
    metrics: ServerMetrics  # what /metrics exports
    meter: Meter  # measured memory per device and engine (`latest()`, `history(id)`)
    rediscover: Callable[[], Fleet] | None = None  # reads the fleet again (app.Backend)
