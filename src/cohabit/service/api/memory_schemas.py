"""Bodies of /api/cluster/memory: the meter's last sample per device and per deployment."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class DeviceMemory(BaseModel):
    node: str
    gpu_index: int | None
    partition_index: int | None
    location: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    cohabit_bytes: int = Field(description="Used by cohabit's engines.")
    foreign_bytes: int = Field(description="Used by anything else (on a pool, the OS too).")
    capacity_bytes: int
    reserved_bytes: int


class MemoryPoint(BaseModel):
    at: datetime
    used_bytes: int | None
    budget_bytes: int


class DeploymentMemory(BaseModel):
    deployment_id: str
    used_bytes: int | None
    budget_bytes: int
    at: datetime
    over_budget: bool
    over_budget_since: datetime | None = None
    history: list[MemoryPoint] = Field(default_factory=list, description="Oldest first.")


class MemoryReport(BaseModel):
    at: datetime | None = Field(description="The last sample; null before the first.")
    interval_s: float
    headroom_bytes: int
    devices: list[DeviceMemory]
    deployments: list[DeploymentMemory]
