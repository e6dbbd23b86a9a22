"""/api/cluster/memory: what the meter last measured — each device's used, free, cohabit and
foreign bytes beside its budgets, and each engine's memory against its budget with a short
history (the web page's sparklines)."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter

from cohabit.service.api.deps import Authorized, Context
from cohabit.service.api.memory_schemas import (
    DeploymentMemory,
    DeviceMemory,
    MemoryPoint,
    MemoryReport,
)
from cohabit.service.api.schemas import GUARDED

router = APIRouter(
    prefix="/cluster", tags=["cluster"], dependencies=[Authorized], responses=GUARDED
)


@router.get("/memory", response_model=MemoryReport)
def memory(context: Context) -> MemoryReport:
    meter = context.meter
    latest = meter.latest()
    return MemoryReport(
        at=latest.at,
        interval_s=meter.interval_s,
        headroom_bytes=meter.headroom_bytes,
        devices=[DeviceMemory(**asdict(device)) for device in latest.devices],
        deployments=[
            DeploymentMemory(
                **asdict(reading),
                history=[
                    MemoryPoint(**asdict(point)) for point in meter.history(reading.deployment_id)
                ],
            )
            for reading in latest.deployments.values()
        ],
    )
