"""What a running server holds, shared by its routers: the database, the engine runtime, the
reconciler, the settings and the token checker. Built in `app.create_app`'s lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from cohabit.runtime.interface import EngineRuntime
from cohabit.service.activity import Activity
from cohabit.service.auth import Authenticator
from cohabit.service.downloads import Downloader
from cohabit.service.meter import Meter
from cohabit.service.metrics import ServerMetrics
from cohabit.service.reconciler import Reconciler
from cohabit.service.settings import Settings
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
