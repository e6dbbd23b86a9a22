"""The hardware model every layer shares: nodes, GPUs, partitions and the fleet.

Discovery adapters, node labels and fleet files all produce these values; the planner reads
them through `classify.slots_of()`. Sizes are bytes (docs/hardware.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from cohabit.units import GIB

DEFAULT_OS_RESERVE_BYTES = 8 * GIB


class Vendor(StrEnum):
    """Who made the accelerator; `cpu` marks a host's system-memory pool."""

    NVIDIA = "nvidia"
    AMD = "amd"
    APPLE = "apple"
    INTEL = "intel"
    CPU = "cpu"


class HardwareClass(StrEnum):
    HARDWARE_ISOLATED = "hardware_isolated"
    SOFTWARE_SHARED = "software_shared"
    UNIFIED_MEMORY = "unified_memory"
    CPU = "cpu"


class Topology(StrEnum):
    STANDALONE_CLUSTER = "standalone_cluster"
    MANAGED_CLUSTER = "managed_cluster"


class SharingStrategy(StrEnum):
    """What a cluster admin configured for sharing whole cards (GPU Operator)."""

    TIME_SLICING = "time-slicing"
    MPS = "mps"


class NoticeCode(StrEnum):
    """Informational notices carried by a node and passed on to what lands there."""

    SHARING_NOT_CONFIGURED = "SharingNotConfigured"
    PARTIAL_DISCOVERY = "PartialDiscovery"


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice:
    code: NoticeCode
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Partition:
    """A hardware partition of one GPU (an NVIDIA MIG instance, an AMD compute partition).

    `uuid` is the slice's own identity (``MIG-…``), the only way CUDA addresses a MIG slice.
    """

    profile: str
    memory_bytes: int
    uuid: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuProcess:
    """A process using a GPU right now (live view only; fleet files do not carry it).

    `used_bytes` is None where the driver cannot say (NVML on Windows WDDM, some MIG setups).
    """

    pid: int
    used_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    """One accelerator as discovery sees it.

    `memory_bytes` is None on unified-memory machines, whose GPU draws from the node's pool.
    `accel_version` is the CUDA version for NVIDIA and the ROCm version for AMD.
    The fields after `free_bytes` are the live view: `driver_version` (kernel driver),
    `mig_enabled` (None where the GPU cannot do MIG) and the `processes` using it.

    `uuid` is the identity an engine is pointed at: NVML's ``GPU-…`` for NVIDIA, ROCr's
    ``GPU-<16 hex digits>`` (the card's unique id) for AMD. `pci_bus_id` is the domain:bus:
    device.function address (``00000000:01:00.0``), informational. `index` is the order the
    vendor's runtime uses when an index has to stand in for the UUID: NVML's (= PCI bus
    order) for NVIDIA, ROCr's enumeration order for AMD.
    """

    index: int
    vendor: Vendor
    product: str
    memory_bytes: int | None = None
    accel_version: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    partitions: tuple[Partition, ...] = ()
    free_bytes: int | None = None
    driver_version: str | None = None
    mig_enabled: bool | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A machine: discrete GPUs, or a unified-memory pool, or (no GPU at all) a CPU pool.

    `sharing_configured` None means "as the fleet says". `schedulable` is False while, for
    example, MIG is being reconfigured; `unschedulable_reason` then says why.
    `free_memory_bytes` is the live free memory of the node's pool (unified or CPU) when
    discovered on the machine itself; fleet files and labels leave it None.
    """

    name: str
    os: str = "linux"
    gpus: tuple[Gpu, ...] = ()
    unified_memory_bytes: int | None = None
    memory_bytes: int | None = None
    os_reserve_bytes: int = DEFAULT_OS_RESERVE_BYTES
    sharing_strategy: SharingStrategy | None = None
    sharing_replicas: int | None = None
    sharing_configured: bool | None = None
    schedulable: bool = True
    unschedulable_reason: str | None = None
    notices: tuple[Notice, ...] = ()
    free_memory_bytes: int | None = None

    @property
    def is_unified(self) -> bool:
        return self.unified_memory_bytes is not None

    @property
    def is_cpu_only(self) -> bool:
        return not self.gpus and not self.is_unified


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """Every node placement may use, in the order that breaks ties."""

    topology: Topology = Topology.STANDALONE_CLUSTER
    fractional: bool = True
    sharing_configured: bool = True
    nodes: tuple[Node, ...] = ()


_VERSION_PART = re.compile(r"\d+")


def version_key(version: str) -> tuple[int, ...]:
    """Compare accelerator versions numerically per component: "12.10" > "12.9".

    >>> version_key("12.10") > version_key("12.9")
    True
    """
    return tuple(int(part) for part in _VERSION_PART.findall(version))


def version_at_least(version: str | None, minimum: str) -> bool:
    """True when `version` is known and is `minimum` or newer."""
    if version is None:
        return False
    return version_key(version) >= version_key(minimum)
