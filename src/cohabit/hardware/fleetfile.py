"""Fleet files: a simulated or recorded inventory in YAML ⇄ `Fleet`.

Used by `cohabit plan`, `cohabit serve --fleet` and `cohabit gpus --export`. The format is
documented in docs/fleet-file.md; every mistake is reported as one `FileProblem` line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml

from cohabit.hardware.model import (
    DEFAULT_OS_RESERVE_BYTES,
    Fleet,
    Gpu,
    Node,
    Partition,
    SharingStrategy,
    Topology,
    Vendor,
)
from cohabit.units import GIB, MIB
from cohabit.yamlfile import Entry, FileProblem, load_mapping

_FLEET_KEYS = ("topology", "fractional", "sharing_configured", "nodes")
_NODE_KEYS = (
    "name",
    "os",
    "gpus",
    "unified_memory",
    "memory",
    "os_reserve",
    "sharing",
    "sharing_configured",
    "schedulable",
    "unschedulable_reason",
)
_GPU_KEYS = (
    "index",
    "vendor",
    "product",
    "memory",
    "accel_version",
    "uuid",
    "pci_bus_id",
    "compute_capability",
    "partitions",
)
_PARTITION_KEYS = ("profile", "memory", "uuid")
_SHARING_KEYS = ("strategy", "replicas")


def load_fleet(path: Path) -> Fleet:
    """Read and check a fleet file.

    Raises:
        FileProblem: unreadable file, unknown key, bad or missing size, duplicate node name or
            GPU index, or a GPU whose memory is unknown outside a unified-memory node.
    """
    top = Entry(path, "", load_mapping(path, what="fleet file"))
    top.check_keys(_FLEET_KEYS, required=("nodes",))
    topology = _enum(top, "topology", Topology, Topology.STANDALONE_CLUSTER)
    nodes: list[Node] = []
    seen: set[str] = set()
    for entry in top.entries("nodes"):
        node = _node(entry)
        if node.name in seen:
            entry.fail(f"duplicate node name {node.name!r}")
        seen.add(node.name)
        nodes.append(node)
    if not nodes:
        top.fail("'nodes' must list at least one node")
    return Fleet(
        topology=topology,
        fractional=top.boolean("fractional", True),
        sharing_configured=top.boolean("sharing_configured", True),
        nodes=tuple(nodes),
    )


def _node(entry: Entry) -> Node:
    entry.check_keys(_NODE_KEYS, required=("name",))
    name = entry.required_string("name")
    unified = entry.size("unified_memory")
    memory = entry.size("memory")
    gpus: list[Gpu] = []
    indices: set[int] = set()
    uuids: set[str] = set()
    for gpu_entry in entry.entries("gpus"):
        gpu = _gpu(gpu_entry, unified=unified is not None)
        if gpu.index in indices:
            gpu_entry.fail(f"duplicate GPU index {gpu.index}")
        indices.add(gpu.index)
        # Two devices with one UUID would point an engine at either of them.
        for uuid in (gpu.uuid, *(p.uuid for p in gpu.partitions if p.uuid != gpu.uuid)):
            if uuid is not None and uuid in uuids:
                gpu_entry.fail(f"duplicate uuid {uuid!r} on this node")
            if uuid is not None:
                uuids.add(uuid)
        gpus.append(gpu)
    if unified is not None and memory is not None:
        entry.fail("give either 'unified_memory' or 'memory', not both")
    if not gpus and unified is None and memory is None:
        entry.fail("a node without GPUs needs 'memory' (its CPU pool) or 'unified_memory'")
    reserve = entry.size("os_reserve", positive=False)
    strategy, replicas = _sharing(entry)
    configured = entry.data.get("sharing_configured")
    if configured is not None and not isinstance(configured, bool):
        entry.fail(f"'sharing_configured' must be true or false, got {configured!r}")
    schedulable = entry.boolean("schedulable", True)
    return Node(
        name=name,
        os=entry.string("os", "linux") or "linux",
        gpus=tuple(gpus),
        unified_memory_bytes=unified,
        memory_bytes=memory,
        os_reserve_bytes=DEFAULT_OS_RESERVE_BYTES if reserve is None else reserve,
        sharing_strategy=strategy,
        sharing_replicas=replicas,
        sharing_configured=configured,
        schedulable=schedulable,
        unschedulable_reason=entry.string("unschedulable_reason"),
    )


def _gpu(entry: Entry, *, unified: bool) -> Gpu:
    entry.check_keys(_GPU_KEYS, required=("index", "vendor"))
    index = entry.required_integer("index")
    vendor = _enum(entry, "vendor", Vendor, Vendor.NVIDIA)
    if vendor is Vendor.CPU:
        entry.fail("'vendor' cpu is for CPU pools; describe the host's 'memory' instead")
    memory = entry.size("memory")
    partitions: list[Partition] = []
    for part_entry in entry.entries("partitions"):
        part_entry.check_keys(_PARTITION_KEYS, required=("profile", "memory"))
        partitions.append(
            Partition(
                profile=part_entry.required_string("profile"),
                memory_bytes=part_entry.required_size("memory"),
                uuid=_uuid(part_entry, vendor, partition=True),
            )
        )
    if memory is None and not unified:
        entry.fail("missing 'memory' (only GPUs of a unified-memory node may omit it)")
    if memory is not None and partitions and sum(p.memory_bytes for p in partitions) > memory:
        entry.fail("partitions add up to more memory than the GPU has")
    version = entry.data.get("accel_version")
    return Gpu(
        index=index,
        vendor=vendor,
        product=entry.string("product", "unknown") or "unknown",
        memory_bytes=memory,
        accel_version=None if version is None else str(version),
        uuid=_uuid(entry, vendor, partition=False),
        pci_bus_id=entry.string("pci_bus_id"),
        compute_capability=entry.string("compute_capability"),
        partitions=tuple(partitions),
    )


# What each runtime accepts in its visible-devices variable (docs/runtime.md): CUDA takes
# `GPU-…` and `MIG-…` as nvidia-smi -L prints them, ROCr takes `GPU-<16 hex digits>`.
_UUID_PREFIX = {
    (Vendor.NVIDIA, False): "GPU-",
    (Vendor.NVIDIA, True): "MIG-",
    (Vendor.AMD, False): "GPU-",
}


def _uuid(entry: Entry, vendor: Vendor, *, partition: bool) -> str | None:
    uuid = entry.string("uuid")
    prefix = _UUID_PREFIX.get((vendor, partition))
    if uuid is not None and prefix is not None and not uuid.startswith(prefix):
        what = "a MIG slice" if partition else f"an {vendor.value} GPU"
        entry.fail(
            f"'uuid' of {what} starts with {prefix!r} (as nvidia-smi -L / rocminfo print it), "
            f"got {uuid!r}"
        )
    return uuid


def _sharing(entry: Entry) -> tuple[SharingStrategy | None, int | None]:
    raw = entry.data.get("sharing")
    if raw is None:
        return None, None
    sharing = Entry(entry.path, f"{entry.label}.sharing", raw)
    sharing.check_keys(_SHARING_KEYS, required=("strategy",))
    strategy = _enum(sharing, "strategy", SharingStrategy, SharingStrategy.TIME_SLICING)
    replicas = sharing.integer("replicas", minimum=1)
    if strategy is SharingStrategy.TIME_SLICING and replicas is None:
        sharing.fail("time-slicing needs 'replicas'")
    return strategy, replicas


_E = TypeVar("_E", Topology, Vendor, SharingStrategy)


def _enum(entry: Entry, key: str, kind: type[_E], default: _E) -> _E:
    value = entry.data.get(key)
    if value is None:
        return default
    try:
        return kind(str(value).lower())
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        entry.fail(f"{key!r} must be one of {allowed}, got {value!r}")


def dump_fleet(fleet: Fleet) -> str:
    """Write a fleet as YAML that `load_fleet` reads back to the same `Fleet`."""
    return yaml.safe_dump(fleet_to_dict(fleet), sort_keys=False)


def fleet_to_dict(fleet: Fleet) -> dict[str, Any]:
    return {
        "topology": fleet.topology.value,
        "fractional": fleet.fractional,
        "sharing_configured": fleet.sharing_configured,
        "nodes": [_node_to_dict(node) for node in fleet.nodes],
    }


def _node_to_dict(node: Node) -> dict[str, Any]:
    data: dict[str, Any] = {"name": node.name}
    if node.os != "linux":
        data["os"] = node.os
    if node.unified_memory_bytes is not None:
        data["unified_memory"] = _size_text(node.unified_memory_bytes)
    if node.memory_bytes is not None:
        data["memory"] = _size_text(node.memory_bytes)
    if node.os_reserve_bytes != DEFAULT_OS_RESERVE_BYTES:
        data["os_reserve"] = _size_text(node.os_reserve_bytes)
    if node.sharing_strategy is not None:
        data["sharing"] = {"strategy": node.sharing_strategy.value}
        if node.sharing_replicas is not None:
            data["sharing"]["replicas"] = node.sharing_replicas
    if node.sharing_configured is not None:
        data["sharing_configured"] = node.sharing_configured
    if not node.schedulable:
        data["schedulable"] = False
        if node.unschedulable_reason:
            data["unschedulable_reason"] = node.unschedulable_reason
    if node.gpus:
        data["gpus"] = [_gpu_to_dict(gpu) for gpu in node.gpus]
    return data


def _gpu_to_dict(gpu: Gpu) -> dict[str, Any]:
    data: dict[str, Any] = {"index": gpu.index, "vendor": gpu.vendor.value, "product": gpu.product}
    if gpu.memory_bytes is not None:
        data["memory"] = _size_text(gpu.memory_bytes)
    for key, value in (
        ("accel_version", gpu.accel_version),
        ("uuid", gpu.uuid),
        ("pci_bus_id", gpu.pci_bus_id),
        ("compute_capability", gpu.compute_capability),
    ):
        if value is not None:
            data[key] = value
    if gpu.partitions:
        data["partitions"] = [
            {"profile": p.profile, "memory": _size_text(p.memory_bytes)}
            | ({"uuid": p.uuid} if p.uuid else {})
            for p in gpu.partitions
        ]
    return data


def _size_text(size_bytes: int) -> str | int:
    """Sizes as people write them, exactly: whole GiB or MiB when they divide, else bytes."""
    if size_bytes % GIB == 0:
        return f"{size_bytes // GIB}GiB"
    if size_bytes % MIB == 0:
        return f"{size_bytes // MIB}MiB"
    return size_bytes


__all__ = ["FileProblem", "dump_fleet", "fleet_to_dict", "load_fleet"]
