"""Bodies of the cluster routes, in the shapes the `kamiwaza-sdk` cluster service validates
(`Hardware`, `Node`, `NodeListNode`, `NodeDetails`, `Cluster`, `Location`), with the budgets
placement sees beside them (`slots`, `topology`, memory fields, `node_name`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field


class Slot(BaseModel):
    """One budget holder: a GPU, a partition or a memory pool, and what is reserved on it."""

    location: str
    gpu_index: int | None
    partition: str | None
    vendor: str
    product: str
    hardware_class: str
    sharing_class: str
    total_bytes: int
    capacity_bytes: int
    reserved_bytes: int
    free_bytes: int
    capacity_gb: int
    free_gb: int


class Hardware(BaseModel):
    """One node's hardware record: what discovery or the fleet file says, and the budgets
    placement sees. `id` and `node_id` are stable UUIDs derived from the node's name."""

    id: UUID
    name: str
    node_name: str
    node_id: UUID
    created_at: datetime
    active: bool
    os: str
    platform: str
    gpus: list[dict[str, Any]]
    processors: list[str] = Field(default_factory=list)
    processor_vendor: str | None = None
    cluster_ip: str | None = None
    local_node_id: str | None = None
    ray_node_id: str | None = None
    configuration: dict[str, Any] = Field(default_factory=dict)
    topology: str
    memory_bytes: int | None = None
    unified_memory_bytes: int | None = None
    schedulable: bool
    unschedulable_reason: str | None = None
    notices: list[dict[str, str]] = Field(default_factory=list)
    slots: list[Slot]


class Node(BaseModel):
    """A node of the fleet. `last_config` is the node as it was last stored; `last_seen` when."""

    id: UUID
    name: str
    hardware_id: UUID
    ray_id: str | None = None
    last_seen: datetime
    last_config: dict[str, Any]
    created_at: datetime
    hardware: Hardware
    location_id: UUID
    active: bool


class RunningNode(BaseModel):
    """`NodeListNode`: a node placement may use now. `resources` counts GPUs and bytes."""

    node_id: str
    alive: bool
    node_manager_hostname: str
    node_manager_address: str | None = None
    node_ip: str | None = None
    resources: dict[str, float]


class Location(BaseModel):
    id: UUID
    name: str
    created_at: datetime
    datacenter: str | None = None
    region: str | None = None
    zone: str | None = None


class Cluster(BaseModel):
    """The one cluster a server places on: its fleet."""

    id: UUID
    name: str
    location_id: UUID
    created_at: datetime
    topology: str
    fractional: bool
    sharing_configured: bool
    node_ids: list[UUID]


class NodeDetails(BaseModel):
    node: Node
    location: Location
    hardware: Hardware
    node_list_node: RunningNode | None = None


class HardwareRefresh(BaseModel):
    """`POST /cluster/refresh_hardware`: what was read again, as the hardware records."""

    message: str
    hardware: list[Hardware]
