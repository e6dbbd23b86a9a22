"""Compact builders for the fleets the placement tests use (sizes in GiB)."""

from __future__ import annotations

from cohabit.hardware.model import Fleet, Gpu, Node, Partition, SharingStrategy, Topology, Vendor
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import GIB


def gpu(
    index: int,
    gib: float,
    *,
    vendor: Vendor = Vendor.NVIDIA,
    version: str | None = "12.4",
    product: str = "GPU",
    mig: tuple[tuple[str, float], ...] = (),
    uuid: str | None = None,
) -> Gpu:
    return Gpu(
        index=index,
        vendor=vendor,
        product=product,
        memory_bytes=int(gib * GIB),
        accel_version=version,
        uuid=uuid,
        partitions=tuple(Partition(profile=p, memory_bytes=int(m * GIB)) for p, m in mig),
    )


def node(name: str, *gpus: Gpu, **kwargs: object) -> Node:
    return Node(name=name, gpus=gpus, **kwargs)  # type: ignore[arg-type]


def unified(name: str, gib: float, *, vendor: Vendor = Vendor.NVIDIA, os: str = "linux") -> Node:
    return Node(
        name=name,
        os=os,
        unified_memory_bytes=int(gib * GIB),
        gpus=(Gpu(index=0, vendor=vendor, product="unified", accel_version="13.0"),),
    )


def cpu_host(name: str, gib: float) -> Node:
    return Node(name=name, memory_bytes=int(gib * GIB))


def fleet(*nodes: Node, **kwargs: object) -> Fleet:
    return Fleet(nodes=nodes, **kwargs)  # type: ignore[arg-type]


def state(*nodes: Node, **kwargs: object) -> FleetState:
    return FleetState(fleet=fleet(*nodes, **kwargs))


def held(
    fleet_state: FleetState, *holdings: tuple[str, str, int | None, float, int | None]
) -> FleetState:
    """`fleet_state` with (deployment, node, gpu index, GiB, partition index) reserved."""
    return fleet_state.with_reservations(
        Reservation(
            deployment=deployment,
            node=node_name,
            gpu_index=gpu_index,
            partition_index=partition,
            reserved_bytes=int(gib * GIB),
        )
        for deployment, node_name, gpu_index, gib, partition in holdings
    )


def req(name: str, gib: float, **kwargs: object) -> PlacementRequest:
    return PlacementRequest(name=name, vram_bytes=int(gib * GIB), **kwargs)  # type: ignore[arg-type]


__all__ = [
    "SharingStrategy",
    "Topology",
    "cpu_host",
    "fleet",
    "gpu",
    "held",
    "node",
    "req",
    "state",
    "unified",
]
