"""/api/cluster/hardware: every node placement sees, its devices and the budgets on them."""

from __future__ import annotations

import threading
from dataclasses import asdict

from fastapi import APIRouter, Response
from pydantic import TypeAdapter

from cohabit.placement.ledger import FleetState
from cohabit.service.api.deps import Authorized, Context
from cohabit.service.api.schemas import Hardware, Slot
from cohabit.store import ledger
from cohabit.units import gib_floor

router = APIRouter(prefix="/cluster", tags=["cluster"], dependencies=[Authorized])
_HARDWARE = TypeAdapter(list[Hardware])


class _LastAnswer:
    """The answer for the last ledger state seen: the store hands back the same state
    object while neither the fleet nor a reservation changed, so polling clients cost two
    small reads, not a rebuild."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: FleetState | None = None
        self._content = b""

    def get(self, state: FleetState) -> bytes:
        with self._lock:
            if state is self._state:
                return self._content
        content = _HARDWARE.dump_json(hardware_view(state))
        with self._lock:
            self._state, self._content = state, content
        return content


_LAST = _LastAnswer()


@router.get("/hardware", response_model=list[Hardware])
def hardware(context: Context) -> Response:
    content = _LAST.get(ledger.current_state(context.db))
    return Response(content, media_type="application/json")


def hardware_view(state: FleetState) -> list[Hardware]:
    used = state.used_bytes()
    free = state.free_bytes()
    nodes: list[Hardware] = []
    for node in state.fleet.nodes:
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
                reserved_bytes=used.get(slot.key, 0),
                free_bytes=free[slot.position],
                capacity_gb=gib_floor(slot.capacity_bytes),
                free_gb=gib_floor(free[slot.position]),
            )
            for slot in state.slots
            if slot.node == node.name
        ]
        nodes.append(
            Hardware(
                node_id=node.name,
                os=node.os,
                platform=node.os,
                topology=state.fleet.topology.value,
                gpus=[asdict(gpu) for gpu in node.gpus],
                memory_bytes=node.memory_bytes,
                unified_memory_bytes=node.unified_memory_bytes,
                schedulable=node.schedulable,
                slots=slots,
            )
        )
    return nodes
