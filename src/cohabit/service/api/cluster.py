"""/api/cluster/…: the fleet placement sees, in the reference's cluster shapes — hardware
records with the budgets on each device, nodes, the nodes placement may use now, the one
cluster and its location, the runtime settings and the host name. Ids: service/api/fleet_ids.py.

Beside the fleet's own, an admin may register locations, clusters and hardware entries (the
reference's create, update and delete routes); they are stored (store/inventory.py) and
listed after the fleet's, marked `registered`, and placement never reads them. The fleet's
own entries are not records to edit: changing or deleting one is a 409 saying so."""

from __future__ import annotations

import socket
import threading
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any, TypeVar
from uuid import UUID

from fastapi import APIRouter, Query, Response
from pydantic import TypeAdapter

from cohabit import __version__
from cohabit.hardware.errors import HardwareError
from cohabit.hardware.fleetfile import FileProblem
from cohabit.hardware.model import Node as FleetNode
from cohabit.hardware.slots import Slot as FleetSlot
from cohabit.placement.state import FleetState
from cohabit.runtime.engines import ENGINES
from cohabit.service.api import fleet_ids
from cohabit.service.api.cluster_schemas import (
    Cluster,
    Hardware,
    HardwareRefresh,
    Location,
    NewCluster,
    NewHardware,
    NewLocation,
    Node,
    NodeDetails,
    RunningNode,
    Slot,
)
from cohabit.service.api.deps import AdminOnly, Authorized, Context
from cohabit.service.api.schemas import GUARDED, TAKEN, answers
from cohabit.service.errors import Conflict, InvalidInput, NotFound, found
from cohabit.store import inventory, ledger
from cohabit.store.database import utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.inventory import InventoryKind, InventoryRecord
from cohabit.units import gib_floor

router = APIRouter(
    prefix="/cluster", tags=["cluster"], dependencies=[Authorized], responses=GUARDED
)

T = TypeVar("T")
Skip = Annotated[int, Query(ge=0, description="How many to leave out from the start.")]
Limit = Annotated[int | None, Query(ge=1, description="At most this many.")]


def _page(items: list[T], skip: int, limit: int | None) -> list[T]:
    return items[skip:] if limit is None else items[skip : skip + limit]


class _Fleet:
    """One read of the ledger and of when each node was seen, mapped to the views."""

    def __init__(self, context: Context, state: FleetState | None = None) -> None:
        self.state: FleetState = state or ledger.current_state(context.db)
        self.seen = ledger.nodes_seen(context.db)
        self.used = self.state.used_bytes()
        self.free = self.state.free_bytes()
        self.slots: dict[str, list[FleetSlot]] = {}
        for slot in self.state.slots:
            self.slots.setdefault(slot.node, []).append(slot)

    @property
    def nodes(self) -> tuple[FleetNode, ...]:
        return self.state.fleet.nodes

    def times(self, node: FleetNode) -> tuple[datetime, datetime]:
        return self.seen.get(node.name) or (utcnow(), utcnow())

    def created_at(self) -> datetime:
        return min((first for first, _ in self.seen.values()), default=utcnow())

    def hardware(self, node: FleetNode) -> Hardware:
        slots = [
            Slot(
                location=slot.location,
                gpu_index=slot.gpu_index,
                partition=slot.partition_profile,
                vendor=slot.vendor.value,
                product=slot.product,
                hardware_class=slot.hardware_class.value,
                sharing_class=slot.sharing_class,
                total_bytes=slot.total_bytes,
                capacity_bytes=slot.capacity_bytes,
                reserved_bytes=self.used.get(slot.key, 0),
                free_bytes=self.free[slot.position],
                capacity_gb=gib_floor(slot.capacity_bytes),
                free_gb=gib_floor(self.free[slot.position]),
            )
            for slot in self.slots.get(node.name, ())
        ]
        fleet = self.state.fleet
        return Hardware(
            id=fleet_ids.hardware_id(node.name),
            name=node.name,
            node_name=node.name,
            node_id=fleet_ids.node_id(node.name),
            created_at=self.times(node)[0],
            active=node.schedulable,
            os=node.os,
            platform=node.os,
            gpus=[asdict(gpu) for gpu in node.gpus],
            local_node_id=node.name,
            configuration={
                "topology": fleet.topology.value,
                "fractional": fleet.fractional,
                "sharing_configured": fleet.sharing_configured,
            },
            topology=fleet.topology.value,
            memory_bytes=node.memory_bytes,
            unified_memory_bytes=node.unified_memory_bytes,
            schedulable=node.schedulable,
            unschedulable_reason=node.unschedulable_reason,
            notices=[{"code": n.code.value, "message": n.message} for n in node.notices],
            slots=slots,
        )

    def node(self, node: FleetNode) -> Node:
        created_at, last_seen = self.times(node)
        return Node(
            id=fleet_ids.node_id(node.name),
            name=node.name,
            hardware_id=fleet_ids.hardware_id(node.name),
            last_seen=last_seen,
            last_config=asdict(node),
            created_at=created_at,
            hardware=self.hardware(node),
            location_id=fleet_ids.location_id(),
            active=node.schedulable,
        )

    def running(self, node: FleetNode) -> RunningNode:
        resources: dict[str, float] = {"GPU": float(len(node.gpus))}
        if node.memory_bytes is not None:
            resources["memory"] = float(node.memory_bytes)
        resources["free_bytes"] = float(
            sum(self.free[s.position] for s in self.slots.get(node.name, ()))
        )
        return RunningNode(
            node_id=str(fleet_ids.node_id(node.name)),
            alive=node.schedulable,
            node_manager_hostname=node.name,
            resources=resources,
        )

    def location(self) -> Location:
        return Location(
            id=fleet_ids.location_id(), name=fleet_ids.CLUSTER_NAME, created_at=self.created_at()
        )

    def cluster(self) -> Cluster:
        fleet = self.state.fleet
        return Cluster(
            id=fleet_ids.cluster_id(),
            name=fleet_ids.CLUSTER_NAME,
            location_id=fleet_ids.location_id(),
            created_at=self.created_at(),
            topology=fleet.topology.value,
            fractional=fleet.fractional,
            sharing_configured=fleet.sharing_configured,
            node_ids=[fleet_ids.node_id(node.name) for node in self.nodes],
        )

    def by_node_id(self, node_id: UUID) -> FleetNode:
        for node in self.nodes:
            if fleet_ids.node_id(node.name) == node_id:
                return node
        raise NotFound(f"node {node_id} not found")


def _registered_location(entry: InventoryRecord) -> Location:
    return Location(
        **{**entry.fields, "name": entry.name},
        id=UUID(entry.id),
        created_at=entry.created_at,
        registered=True,
    )


def _registered_cluster(entry: InventoryRecord) -> Cluster:
    return Cluster(
        id=UUID(entry.id),
        name=entry.name,
        location_id=UUID(entry.fields["location_id"]),
        created_at=entry.created_at,
        registered=True,
        topology=None,
        fractional=None,
        sharing_configured=None,
        node_ids=[],
    )


_REGISTERED_HARDWARE = (
    "registered through the API: placement uses the fleet this server reads, not this entry"
)


def _registered_hardware(entry: InventoryRecord) -> Hardware:
    fields = entry.fields
    return Hardware(
        id=UUID(entry.id),
        name=entry.name or None,
        node_name=None,
        node_id=None,
        created_at=entry.created_at,
        active=False,
        registered=True,
        os=fields.get("os"),
        platform=fields.get("platform"),
        gpus=fields.get("gpus") or [],
        processors=fields.get("processors") or [],
        processor_vendor=fields.get("processor_vendor"),
        cluster_ip=fields.get("cluster_ip"),
        local_node_id=fields.get("local_node_id"),
        ray_node_id=fields.get("ray_node_id"),
        configuration=fields.get("configuration") or {},
        topology=None,
        schedulable=False,
        unschedulable_reason=_REGISTERED_HARDWARE,
        slots=[],
    )


_HARDWARE = TypeAdapter(list[Hardware])
# The routes that register inventory (201) and delete it (204; the fleet's own: 409).
_REGISTERS: dict[str, Any] = {
    "status_code": 201,
    "responses": answers(400),
    "dependencies": [AdminOnly],
}
_DELETES: dict[str, Any] = {
    "status_code": 204,
    "responses": answers(404) | TAKEN,
    "dependencies": [AdminOnly],
}


class _LastAnswer:
    """The hardware answer for the last ledger state seen: the store hands back the same
    state object while neither the fleet nor a reservation changed (and a node's first-seen
    time changes only with the fleet), so polling clients cost one small read, not a
    rebuild."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[FleetState, int, int | None] | None = None
        self._content = b""

    def get(self, context: Context, skip: int, limit: int | None) -> bytes:
        state = ledger.current_state(context.db)
        with self._lock:
            if self._key is not None and self._key[0] is state and self._key[1:] == (skip, limit):
                return self._content
        fleet = _Fleet(context, state)
        content = _HARDWARE.dump_json(
            _page([fleet.hardware(node) for node in fleet.nodes], skip, limit)
        )
        with self._lock:
            self._key, self._content = (state, skip, limit), content
        return content


_LAST = _LastAnswer()


@router.get("/hardware", response_model=list[Hardware])
def hardware(context: Context, skip: Skip = 0, limit: Limit = None) -> Response:
    """The fleet's nodes, then the hardware entries an admin registered."""
    registered = inventory.list_kind(context.db, InventoryKind.HARDWARE)
    if not registered:
        return Response(_LAST.get(context, skip, limit), media_type="application/json")
    fleet = _Fleet(context)
    every = [fleet.hardware(node) for node in fleet.nodes]
    every += [_registered_hardware(entry) for entry in registered]
    return Response(_HARDWARE.dump_json(_page(every, skip, limit)), media_type="application/json")


@router.post(
    "/hardware",
    response_model=Hardware,
    **_REGISTERS,
)
def create_hardware(body: NewHardware, context: Context) -> Hardware:
    """Register a hardware entry (inventory: placement does not use it)."""
    fields = body.model_dump(exclude={"name"}, exclude_none=True)
    entry = inventory.add(context.db, InventoryKind.HARDWARE, body.name or "", fields)
    return _registered_hardware(entry)


@router.get("/hardware/{hardware_id}", response_model=Hardware, responses=answers(404))
def get_hardware(hardware_id: UUID, context: Context) -> Hardware:
    fleet = _Fleet(context)
    for node in fleet.nodes:
        if fleet_ids.hardware_id(node.name) == hardware_id:
            return fleet.hardware(node)
    entry = found(lambda: inventory.get(context.db, InventoryKind.HARDWARE, str(hardware_id)))
    return _registered_hardware(entry)


@router.delete(
    "/hardware/{hardware_id}",
    **_DELETES,
)
def delete_hardware(hardware_id: UUID, context: Context) -> Response:
    """Delete a registered hardware entry. A node of the fleet is not deleted here: it
    leaves the fleet file, the machine or the cluster, then `POST /cluster/refresh_hardware`."""
    for node in _Fleet(context).nodes:
        if fleet_ids.hardware_id(node.name) == hardware_id:
            raise Conflict(
                f"hardware {hardware_id} is node {node.name!r} of the fleet, not a registered "
                "entry: take it out of the fleet, then POST /cluster/refresh_hardware"
            )
    found(lambda: inventory.remove(context.db, InventoryKind.HARDWARE, str(hardware_id)))
    return Response(status_code=204)


@router.get("/nodes", response_model=list[Node])
def nodes(
    context: Context, skip: Skip = 0, limit: Limit = None, active: bool | None = None
) -> list[Node]:
    fleet = _Fleet(context)
    chosen = [n for n in fleet.nodes if active is None or n.schedulable == active]
    return _page([fleet.node(node) for node in chosen], skip, limit)


@router.get("/node/{node_id}", response_model=NodeDetails, responses=answers(404))
def node_details(node_id: UUID, context: Context) -> NodeDetails:
    fleet = _Fleet(context)
    node = fleet.by_node_id(node_id)
    return NodeDetails(
        node=fleet.node(node),
        location=fleet.location(),
        hardware=fleet.hardware(node),
        node_list_node=fleet.running(node) if node.schedulable else None,
    )


@router.get("/get_running_nodes", response_model=list[RunningNode])
def running_nodes(context: Context) -> list[RunningNode]:
    """The nodes placement may use now (schedulable ones)."""
    fleet = _Fleet(context)
    return [fleet.running(node) for node in fleet.nodes if node.schedulable]


@router.get("/clusters", response_model=list[Cluster])
def clusters(context: Context, skip: Skip = 0, limit: Limit = None) -> list[Cluster]:
    """The cluster this server places on, then the clusters an admin registered."""
    registered = inventory.list_kind(context.db, InventoryKind.CLUSTER)
    every = [_Fleet(context).cluster(), *map(_registered_cluster, registered)]
    return _page(every, skip, limit)


@router.post(
    "/cluster",
    response_model=Cluster,
    **_REGISTERS,
)
def create_cluster(body: NewCluster, context: Context) -> Cluster:
    """Register a cluster at a location (the fleet's or a registered one). It has no nodes:
    this server places on its own fleet only."""
    if body.location_id != fleet_ids.location_id():
        try:
            inventory.get(context.db, InventoryKind.LOCATION, str(body.location_id))
        except RecordNotFound:
            raise InvalidInput(
                f"location {body.location_id} not found", loc=("body", "location_id")
            ) from None
    fields = {"location_id": str(body.location_id)}
    return _registered_cluster(inventory.add(context.db, InventoryKind.CLUSTER, body.name, fields))


@router.get("/cluster/{cluster_id}", response_model=Cluster, responses=answers(404))
def get_cluster(cluster_id: UUID, context: Context) -> Cluster:
    if cluster_id == fleet_ids.cluster_id():
        return _Fleet(context).cluster()
    entry = found(lambda: inventory.get(context.db, InventoryKind.CLUSTER, str(cluster_id)))
    return _registered_cluster(entry)


@router.delete(
    "/cluster/{cluster_id}",
    **_DELETES,
)
def delete_cluster(cluster_id: UUID, context: Context) -> Response:
    """Delete a registered cluster; the one this server places on is not a record."""
    if cluster_id == fleet_ids.cluster_id():
        raise Conflict(f"cluster {cluster_id} is the fleet this server places on, not an entry")
    found(lambda: inventory.remove(context.db, InventoryKind.CLUSTER, str(cluster_id)))
    return Response(status_code=204)


@router.get("/locations", response_model=list[Location])
def locations(context: Context, skip: Skip = 0, limit: Limit = None) -> list[Location]:
    """The fleet's location, then the locations an admin registered."""
    registered = inventory.list_kind(context.db, InventoryKind.LOCATION)
    every = [_Fleet(context).location(), *map(_registered_location, registered)]
    return _page(every, skip, limit)


@router.post(
    "/location",
    response_model=Location,
    **_REGISTERS,
)
def create_location(body: NewLocation, context: Context) -> Location:
    fields = body.model_dump(exclude={"name"}, exclude_none=True)
    return _registered_location(
        inventory.add(context.db, InventoryKind.LOCATION, body.name, fields)
    )


@router.get("/location/{location_id}", response_model=Location, responses=answers(404))
def get_location(location_id: UUID, context: Context) -> Location:
    if location_id == fleet_ids.location_id():
        return _Fleet(context).location()
    entry = found(lambda: inventory.get(context.db, InventoryKind.LOCATION, str(location_id)))
    return _registered_location(entry)


@router.put(
    "/location/{location_id}",
    response_model=Location,
    responses=answers(400, 404) | TAKEN,
    dependencies=[AdminOnly],
)
def update_location(location_id: UUID, body: NewLocation, context: Context) -> Location:
    """Replace a registered location's fields (a field left out is cleared)."""
    _not_the_fleets_location(location_id)
    fields = body.model_dump(exclude={"name"}, exclude_none=True)
    entry = found(
        lambda: inventory.replace(
            context.db, InventoryKind.LOCATION, str(location_id), body.name, fields
        )
    )
    return _registered_location(entry)


@router.delete(
    "/location/{location_id}",
    **_DELETES,
)
def delete_location(location_id: UUID, context: Context) -> Response:
    """Delete a registered location no registered cluster is at (409 naming them)."""
    _not_the_fleets_location(location_id)
    found(lambda: inventory.get(context.db, InventoryKind.LOCATION, str(location_id)))
    at = [
        entry.name
        for entry in inventory.list_kind(context.db, InventoryKind.CLUSTER)
        if entry.fields.get("location_id") == str(location_id)
    ]
    if at:
        raise Conflict(
            f"location {location_id} is where cluster(s) {', '.join(map(repr, at))} are: "
            "delete them first"
        )
    found(lambda: inventory.remove(context.db, InventoryKind.LOCATION, str(location_id)))
    return Response(status_code=204)


def _not_the_fleets_location(location_id: UUID) -> None:
    if location_id == fleet_ids.location_id():
        raise Conflict(f"location {location_id} is the fleet's own, not a registered entry")


@router.get("/federations", response_model=list[dict[str, Any]])
def federations() -> list[dict[str, Any]]:
    """The clusters this one federates with: none (a server places on its own fleet; the
    reference's federation and pairing routes are not served)."""
    return []


@router.get("/cluster_capabilities")
def cluster_capabilities(context: Context) -> dict[str, Any]:
    """What the fleet offers, summed up: its topology and sharing rules, the node operating
    systems, GPU vendors, hardware and sharing classes, and the engines this server runs."""
    state = ledger.current_state(context.db)
    fleet = state.fleet
    return {
        "topology": fleet.topology.value,
        "fractional": fleet.fractional,
        "sharing_configured": fleet.sharing_configured,
        "nodes": len(fleet.nodes),
        "schedulable_nodes": sum(1 for node in fleet.nodes if node.schedulable),
        "gpus": sum(len(node.gpus) for node in fleet.nodes),
        "platforms": sorted({node.os for node in fleet.nodes}),
        "gpu_vendors": sorted({gpu.vendor.value for node in fleet.nodes for gpu in node.gpus}),
        "hardware_classes": sorted({slot.hardware_class.value for slot in state.slots}),
        "sharing_classes": sorted({slot.sharing_class for slot in state.slots}),
        "engines": list(ENGINES),
    }


@router.get("/runtime_config")
def runtime_config(context: Context) -> dict[str, Any]:
    """How this server places and runs: the fleet's rules, the engines, the reconciler."""
    fleet = ledger.current_state(context.db).fleet
    settings = context.settings
    return {
        "version": __version__,
        "topology": fleet.topology.value,
        "fractional": fleet.fractional,
        "sharing_configured": fleet.sharing_configured,
        "engines": list(ENGINES),
        "runtime": type(context.runtime).__name__,
        "poll_interval_s": settings.poll_interval_s,
        "lease_s": settings.lease_s,
        "startup_timeout_s": settings.startup_timeout_s,
        "token_required": bool(settings.token),
    }


@router.get("/get_hostname")
def get_hostname() -> dict[str, str]:
    """The name of the host the API runs on."""
    return {"hostname": socket.gethostname()}


@router.post(
    "/refresh_hardware",
    response_model=HardwareRefresh,
    responses=answers() | TAKEN,
    dependencies=[AdminOnly],
)
def refresh_hardware(context: Context) -> HardwareRefresh:
    """Read the fleet again as the server read it at start (this machine's discovery, its
    `--fleet` file, or the cluster) and store it; placement sees it from then on. A read that
    fails keeps the stored fleet and answers 409 saying why."""
    if context.rediscover is None:
        raise Conflict("this server's fleet was handed to it at start: nothing to read again")
    try:
        fleet = context.rediscover()
    except (HardwareError, FileProblem) as err:
        raise Conflict(f"reading the fleet again failed, the stored fleet stands: {err}") from None
    ledger.save_fleet(context.db, fleet)
    view = _Fleet(context)
    names = ", ".join(node.name for node in view.nodes)
    return HardwareRefresh(
        message=f"hardware refreshed: {len(view.nodes)} node(s) ({names})",
        hardware=[view.hardware(node) for node in view.nodes],
    )
