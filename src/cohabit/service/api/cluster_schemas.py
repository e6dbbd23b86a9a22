"""Bodies of the cluster routes, in the shapes the `kamiwaza-sdk` cluster service validates
(`Hardware`, `Node`, `NodeListNode`, `NodeDetails`, `Cluster`, `Location`), with the budgets
placement sees beside them (`slots`, `topology`, memory fields, `node_name`); and the bodies an
admin registers inventory with (`NewLocation`, `NewCluster`, `NewHardware`: the SDK's
`CreateLocation`, `CreateCluster`, `CreateHardware`). `registered` tells an entry an admin
registered (store/inventory.py; placement never reads it) from the fleet's own."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from cohabit.service.api.fields import JsonObject, Name


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
    placement sees. `id` and `node_id` are stable UUIDs derived from the node's name. A
    registered entry has no node, no slots, and is neither active nor schedulable."""

    id: UUID
    name: str | None
    node_name: str | None
    node_id: UUID | None
    created_at: datetime
    active: bool
    registered: bool = False
    os: str | None
    platform: str | None
    gpus: list[dict[str, Any]]
    processors: list[str] = Field(default_factory=list)
    processor_vendor: str | None = None
    cluster_ip: str | None = None
    local_node_id: str | None = None
    ray_node_id: str | None = None
    configuration: dict[str, Any] = Field(default_factory=dict)
    topology: str | None
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


class NewLocation(BaseModel):
    """`POST`/`PUT /cluster/location`: a place, as the reference describes one."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1)
    datacenter: Name | None = None
    region: Name | None = None
    zone: Name | None = None
    building: Name | None = None
    address: Name | None = None
    contact_phone: Name | None = None
    contact_name: Name | None = None
    contact_email: Name | None = None
    placement_group_id: Name | None = None


class Location(NewLocation):
    model_config = ConfigDict(extra="ignore")

    id: UUID
    name: str
    created_at: datetime
    registered: bool = False


class NewCluster(BaseModel):
    """`POST /cluster/cluster`: a named cluster at a location (the fleet's or a registered
    one)."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(min_length=1)
    location_id: UUID


class Cluster(BaseModel):
    """The one cluster a server places on (its fleet), or one an admin registered (no nodes,
    and no placement rules of its own)."""

    id: UUID
    name: str
    location_id: UUID
    created_at: datetime
    registered: bool = False
    topology: str | None
    fractional: bool | None
    sharing_configured: bool | None
    node_ids: list[UUID]


class NewHardware(BaseModel):
    """`POST /cluster/hardware`: a machine as the reference's hardware record describes it."""

    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    gpus: list[JsonObject] | None = Field(default=None, max_length=1024)
    cluster_ip: Name | None = None
    processors: list[Name] | None = Field(default=None, max_length=1024)
    processor_vendor: Name | None = None
    os: Name | None = None
    platform: Name | None = None
    local_node_id: Name | None = None
    ray_node_id: Name | None = None
    configuration: JsonObject | None = None


class NodeDetails(BaseModel):
    node: Node
    location: Location
    hardware: Hardware
    node_list_node: RunningNode | None = None


class HardwareRefresh(BaseModel):
    """`POST /cluster/refresh_hardware`: what was read again, as the hardware records."""

    message: str
    hardware: list[Hardware]
