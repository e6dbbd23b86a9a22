"""Kubernetes node labels and allocatable ⇄ `Node`: NVIDIA GPU Operator / GPU Feature
Discovery, AMD's node labeller, and our own `cohabit.dev/*` labels.

`node_from_labels()` is what the Kubernetes layer calls for every node it can read;
`labels_for_node()`, `annotations_for_node()` and `allocatable_for_node()` are what our node
agent publishes. Pure functions: no client, no I/O. Label facts are in docs/hardware.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cohabit.hardware import classify
from cohabit.hardware.model import (
    Fleet,
    Gpu,
    Node,
    Notice,
    NoticeCode,
    Partition,
    SharingStrategy,
    Vendor,
)
from cohabit.hardware.slots import SlotKind, slots_of
from cohabit.units import GIB, MIB, SizeError, gib_floor, parse_size

# NVIDIA GPU Feature Discovery (GFD) and GPU Operator labels. Memory labels are MiB.
NV_PRESENT = "nvidia.com/gpu.present"
NV_PRODUCT = "nvidia.com/gpu.product"
NV_MEMORY = "nvidia.com/gpu.memory"
NV_COUNT = "nvidia.com/gpu.count"
NV_REPLICAS = "nvidia.com/gpu.replicas"
NV_SHARING = "nvidia.com/gpu.sharing-strategy"
NV_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
NV_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
NV_MIG_CAPABLE = "nvidia.com/mig.capable"
NV_MIG_STRATEGY = "nvidia.com/mig.strategy"
NV_MIG_STATE = "nvidia.com/mig.config.state"
NV_DRIVER = "nvidia.com/cuda.driver-version.full"
NV_RUNTIME = "nvidia.com/cuda.runtime-version.full"
NV_RUNTIME_MAJOR = "nvidia.com/cuda.runtime-version.major"
NV_RUNTIME_MINOR = "nvidia.com/cuda.runtime-version.minor"
NV_GPU_RESOURCE = "nvidia.com/gpu"
NV_SHARED_RESOURCE = "nvidia.com/gpu.shared"
_NV_MIG_LABEL = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/]+)\.(?P<field>count|memory)$")
_NV_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(?P<profile>[^/.]+(?:\.[^/.]+)*)$")
# MIG Manager states during which it evicts GPU pods and re-partitions the cards.
MIG_BUSY_STATES = frozenset({"pending", "rebooting", "failed"})

# AMD (ROCm k8s-device-plugin node labeller). `vram` is whole GiB with a "G" ("192G").
AMD_PRODUCT = "amd.com/gpu.product-name"
AMD_VRAM = "amd.com/gpu.vram"
AMD_PARTITION = "amd.com/gpu.compute-memory-partition"
AMD_DRIVER = "amd.com/gpu.driver-version"
AMD_GPU_RESOURCE = "amd.com/gpu"
_AMD_COUNTER = re.compile(r"^(?:beta\.)?amd\.com/gpu\.(?P<name>[a-z-]+)\.(?P<value>.+)$")

# Ours, published by the node agent on standalone clusters.
OUR_VENDOR = "cohabit.dev/gpu-vendor"
OUR_MEMORY_CLASS = "cohabit.dev/gpu-memory-class"  # unified | discrete
OUR_MEMORY_MIB = "cohabit.dev/gpu-memory-mib"  # per GPU, or the unified pool
OUR_GPU_MEMORY_MIB = "cohabit.dev/gpu-{index}-memory-mib"  # only when GPUs differ
OUR_COUNT = "cohabit.dev/gpu-count"
OUR_PRODUCT = "cohabit.dev/gpu-product"
OUR_ACCEL = "cohabit.dev/gpu-accel-version"
OUR_VRAM_RESOURCE = "cohabit.dev/vram-gb-gpu-{index}"
# Whole-GPU placement on a standalone cluster: one unit per device, so a pod names its card.
OUR_GPU_RESOURCE = "cohabit.dev/gpu-{index}"
_OUR_VRAM_RESOURCE = re.compile(r"^cohabit\.dev/vram-gb-gpu-(?P<index>\d+)$")
# Device identities are annotations, not labels: a PCI address has ':' and an old-style MIG
# UUID has '/', neither allowed in a label value. Keyed by the agent's GPU index.
OUR_GPU_UUID = "cohabit.dev/gpu-{index}-uuid"
OUR_GPU_PCI_BUS_ID = "cohabit.dev/gpu-{index}-pci-bus-id"
OUR_PARTITION_UUID = "cohabit.dev/gpu-{index}-partition-{partition}-uuid"
# A GPU another DRA driver or a device plugin offers too, and who: the agent's DRA backend
# does not publish it, and placement counts it as offering nothing.
OUR_GPU_OFFERED_BY = "cohabit.dev/gpu-{index}-offered-by"
UNIFIED = "unified"
DISCRETE = "discrete"

CAPACITY_MEMORY = "status.capacity.memory"
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def node_from_labels(
    name: str,
    labels: Mapping[str, str],
    *,
    allocatable: Mapping[str, str] | None = None,
    memory_capacity: str | int | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Node:
    """A cluster node as placement sees it, from its labels, `status.allocatable` and
    `status.capacity.memory` (a Kubernetes quantity such as ``"127600748Ki"``). Our agent's
    `annotations` give its GPUs (and their partitions) their `uuid` and `pci_bus_id`.

    Never raises for what a cluster says: labels that are missing or unreadable make a
    `PartialDiscovery` notice naming them, and the node keeps what could be read (a GPU of
    unknown memory offers nothing). A node with MIG being reconfigured is unschedulable.
    """
    reader = _Reader(labels, allocatable or {}, allocatable is not None)
    host_bytes = _quantity(memory_capacity)
    vendor = _vendor(reader)
    if reader.get(OUR_VENDOR) is not None and vendor is not Vendor.CPU:
        node = _own_node(reader, vendor, host_bytes)
        # Only our own GPUs: their indices are the agent's, which the annotations are keyed by.
        node.gpus = [_with_identity(gpu, annotations or {}) for gpu in node.gpus]
    elif vendor is Vendor.NVIDIA:
        node = _nvidia_node(reader, host_bytes)
    elif vendor is Vendor.AMD:
        node = _amd_node(reader, host_bytes)
    else:
        if host_bytes is None:
            reader.missing.append(CAPACITY_MEMORY)
        node = _Parts(memory_bytes=host_bytes)
    return node.build(name, reader)


def labels_for_node(node: Node) -> dict[str, str]:
    """The `cohabit.dev/*` labels our node agent publishes for a discovered node.

    >>> from cohabit.hardware.model import Gpu, Node, Vendor
    >>> labels_for_node(Node(name="a", gpus=(Gpu(index=0, vendor=Vendor.NVIDIA,
    ...     product="Tesla T4", memory_bytes=15360 * MIB, accel_version="12.2"),)))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'cohabit.dev/gpu-vendor': 'nvidia', 'cohabit.dev/gpu-count': '1',
     'cohabit.dev/gpu-product': 'Tesla-T4', 'cohabit.dev/gpu-accel-version': '12.2',
     'cohabit.dev/gpu-memory-class': 'discrete', 'cohabit.dev/gpu-memory-mib': '15360'}
    """
    if not node.gpus:
        return {OUR_VENDOR: Vendor.CPU.value}
    first = node.gpus[0]
    labels = {
        OUR_VENDOR: first.vendor.value,
        OUR_COUNT: str(len(node.gpus)),
        OUR_PRODUCT: label_value(first.product),
    }
    if first.accel_version:
        labels[OUR_ACCEL] = label_value(first.accel_version)
    if node.unified_memory_bytes is not None:
        labels[OUR_MEMORY_CLASS] = UNIFIED
        labels[OUR_MEMORY_MIB] = str(node.unified_memory_bytes // MIB)
        return labels
    labels[OUR_MEMORY_CLASS] = DISCRETE
    sizes = {gpu.index: (gpu.memory_bytes or 0) // MIB for gpu in node.gpus}
    if len(set(sizes.values())) == 1:
        labels[OUR_MEMORY_MIB] = str(next(iter(sizes.values())))
    else:
        for index, size_mib in sizes.items():
            labels[OUR_GPU_MEMORY_MIB.format(index=index)] = str(size_mib)
    return labels


def annotations_for_node(node: Node) -> dict[str, str]:
    """The device identities our node agent publishes as annotations, where discovery knows
    them: each GPU's UUID and PCI address, and each partition's UUID.

    >>> from cohabit.hardware.model import Gpu, Node, Vendor
    >>> annotations_for_node(Node(name="a", gpus=(Gpu(index=0, vendor=Vendor.NVIDIA,
    ...     product="Tesla T4", uuid="GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61",
    ...     pci_bus_id="00000000:3B:00.0"),)))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'cohabit.dev/gpu-0-uuid': 'GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61',
     'cohabit.dev/gpu-0-pci-bus-id': '00000000:3B:00.0'}
    """
    annotations: dict[str, str] = {}
    for gpu in node.gpus:
        if gpu.uuid:
            annotations[OUR_GPU_UUID.format(index=gpu.index)] = gpu.uuid
        if gpu.pci_bus_id:
            annotations[OUR_GPU_PCI_BUS_ID.format(index=gpu.index)] = gpu.pci_bus_id
        for position, part in enumerate(gpu.partitions):
            if part.uuid:
                key = OUR_PARTITION_UUID.format(index=gpu.index, partition=position)
                annotations[key] = part.uuid
    return annotations


def _with_identity(gpu: Gpu, annotations: Mapping[str, str]) -> Gpu:
    """`gpu` with the UUIDs and PCI address our agent annotated for its index."""

    def get(key: str) -> str | None:
        value = annotations.get(key)
        return (value.strip() or None) if isinstance(value, str) else None

    partitions = tuple(
        replace(
            part, uuid=get(OUR_PARTITION_UUID.format(index=gpu.index, partition=j)) or part.uuid
        )
        for j, part in enumerate(gpu.partitions)
    )
    return replace(
        gpu,
        uuid=get(OUR_GPU_UUID.format(index=gpu.index)) or gpu.uuid,
        pci_bus_id=get(OUR_GPU_PCI_BUS_ID.format(index=gpu.index)) or gpu.pci_bus_id,
        partitions=partitions,
    )


def allocatable_for_node(node: Node, *, whole_gpus: bool = False) -> dict[str, str]:
    """Per-GPU budgets our node agent advertises: ``cohabit.dev/vram-gb-gpu-<i>`` in whole
    GiB, rounded down (docs/hardware.md). A unified pool is one budget, gpu-0, after the OS
    reserve. Hardware partitions are left to the vendor's device plugin; CPU pools get none.
    `whole_gpus` (fractional placement off): one ``cohabit.dev/gpu-<i>`` per device instead.
    """
    resources: dict[str, str] = {}
    for slot in slots_of(Fleet(nodes=(node,))):
        if slot.kind is SlotKind.GPU:
            index = slot.gpu_index
        elif slot.kind is SlotKind.POOL and slot.vendor is not Vendor.CPU:
            index = 0
        else:
            continue
        if whole_gpus:
            resources[OUR_GPU_RESOURCE.format(index=index)] = "1"
        else:
            resources[OUR_VRAM_RESOURCE.format(index=index)] = str(gib_floor(slot.capacity_bytes))
    return resources


def label_value(text: str) -> str:
    """Text made into a valid label value (≤ 63 of ``[A-Za-z0-9._-]``, alphanumeric ends),
    spaces becoming dashes as GPU Feature Discovery writes products ("NVIDIA-GB10")."""
    value = _LABEL_VALUE_BAD.sub("-", text.strip())[:63]
    return value.strip("._-")


@dataclass
class _Reader:
    """Label and allocatable look-ups that remember what was missing or unreadable."""

    labels: Mapping[str, str]
    allocatable: Mapping[str, str]
    has_allocatable: bool
    missing: list[str] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        value = self.labels.get(key)
        return None if value is None or not str(value).strip() else str(value).strip()

    def number(self, key: str, *, required: bool = False) -> int | None:
        """A whole-number label; None (and noted, when `required` or unreadable) otherwise."""
        value = self.get(key)
        if value is None:
            if required:
                self.missing.append(key)
            return None
        if not value.isdigit():
            self.missing.append(f"{key} (unreadable {value!r})")
            return None
        return int(value)

    def resource(self, key: str) -> int | None:
        value = self.allocatable.get(key)
        if value is None:
            return None
        text = str(value).strip()
        return int(text) if text.isdigit() else None


@dataclass
class _Parts:
    """What a vendor reader found, before it becomes a frozen Node."""

    gpus: list[Gpu] = field(default_factory=list)
    unified_memory_bytes: int | None = None
    memory_bytes: int | None = None
    sharing_strategy: SharingStrategy | None = None
    sharing_replicas: int | None = None
    sharing_configured: bool | None = None
    unschedulable_reason: str | None = None

    def build(self, name: str, reader: _Reader) -> Node:
        notices: tuple[Notice, ...] = ()
        if reader.missing:
            missing = ", ".join(dict.fromkeys(reader.missing))
            notices = (Notice(code=NoticeCode.PARTIAL_DISCOVERY, message=f"missing: {missing}"),)
        return Node(
            name=name,
            gpus=tuple(self.gpus),
            unified_memory_bytes=self.unified_memory_bytes,
            memory_bytes=self.memory_bytes,
            sharing_strategy=self.sharing_strategy,
            sharing_replicas=self.sharing_replicas,
            sharing_configured=self.sharing_configured,
            schedulable=self.unschedulable_reason is None,
            unschedulable_reason=self.unschedulable_reason,
            notices=notices,
        )


def _vendor(reader: _Reader) -> Vendor:
    ours = reader.get(OUR_VENDOR)
    if ours is not None:
        try:
            return Vendor(ours.lower())
        except ValueError:
            reader.missing.append(f"{OUR_VENDOR} (unknown vendor {ours!r})")
    keys = [*reader.labels, *reader.allocatable]
    if any(key.startswith(("nvidia.com/gpu", "nvidia.com/mig")) for key in keys):
        return Vendor.NVIDIA
    if any(key.startswith(("amd.com/", "beta.amd.com/")) for key in keys):
        return Vendor.AMD
    return Vendor.CPU


def _quantity(value: str | int | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value, field=CAPACITY_MEMORY)
    except SizeError:
        return None


def _mig_state_reason(reader: _Reader) -> str | None:
    state = reader.get(NV_MIG_STATE)
    if state is not None and state.lower() in MIG_BUSY_STATES:
        return f"MIG reconfiguration {state.lower()} ({NV_MIG_STATE}={state})"
    return None


def _nvidia_node(reader: _Reader, host_bytes: int | None) -> _Parts:
    parts = _Parts(unschedulable_reason=_mig_state_reason(reader))
    raw_product = reader.get(NV_PRODUCT)
    if raw_product is None:
        reader.missing.append(NV_PRODUCT)
    product, mig_profile = _split_nvidia_product(raw_product or "NVIDIA GPU")
    if mig_profile == "INVALID":
        parts.unschedulable_reason = (
            f"invalid MIG layout for mig.strategy=single ({NV_PRODUCT}={raw_product})"
        )
        return parts
    runtime = reader.get(NV_RUNTIME)
    if runtime is None and reader.get(NV_RUNTIME_MAJOR) is not None:
        runtime = f"{reader.get(NV_RUNTIME_MAJOR)}.{reader.get(NV_RUNTIME_MINOR) or 0}"
    if runtime is None:
        reader.missing.append(NV_RUNTIME)
    major, minor = reader.get(NV_COMPUTE_MAJOR), reader.get(NV_COMPUTE_MINOR)
    base = Gpu(
        index=0,
        vendor=Vendor.NVIDIA,
        product=product,
        accel_version=runtime,
        compute_capability=f"{major}.{minor or 0}" if major is not None else None,
        driver_version=reader.get(NV_DRIVER),
    )
    replicas = reader.number(NV_REPLICAS) or 1
    unified = classify.is_unified_memory_product(Vendor.NVIDIA, product)
    if unified:
        count = reader.number(NV_COUNT) or reader.resource(NV_GPU_RESOURCE) or 1
        parts.gpus = [replace(base, index=i) for i in range(count)]
        parts.unified_memory_bytes = host_bytes
        if host_bytes is None:
            reader.missing.append(CAPACITY_MEMORY)
        return parts
    if mig_profile is not None:  # mig.strategy=single: every device is a slice of one profile
        count = reader.number(NV_COUNT, required=True) or 0
        slice_mib = reader.number(NV_MEMORY, required=True)
        parts.gpus = _mig_devices(base, [(mig_profile, count, slice_mib)], start=0)
        parts.sharing_configured = True
        return parts
    mig_kinds = _mixed_mig_kinds(reader)
    full_count = _full_gpu_count(reader, replicas, has_mig=bool(mig_kinds))
    memory_mib = reader.number(NV_MEMORY, required=full_count > 0)
    memory = memory_mib * MIB if memory_mib is not None else None
    parts.gpus = [replace(base, index=i, memory_bytes=memory) for i in range(full_count)]
    parts.gpus += _mig_devices(base, mig_kinds, start=full_count)
    _read_sharing(parts, reader, replicas, raw_product or "")
    return parts


def _split_nvidia_product(raw: str) -> tuple[str, str | None]:
    """``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED`` → (``NVIDIA-A100-SXM4-40GB``, ``1g.5gb``)."""
    product = raw.removesuffix("-SHARED")
    base, marker, profile = product.partition("-MIG-")
    return (base, profile) if marker else (product, None)


def _mixed_mig_kinds(reader: _Reader) -> list[tuple[str, int, int | None]]:
    """(profile, device count, memory MiB) per MIG profile, from the mixed-strategy labels,
    else from allocatable ``nvidia.com/mig-<profile>``."""
    counts: dict[str, int] = {}
    for key in reader.labels:
        match = _NV_MIG_LABEL.match(key)
        if match and match["field"] == "count":
            counts[match["profile"]] = reader.number(key) or 0
    for key in reader.allocatable:
        match = _NV_MIG_RESOURCE.match(key)
        if match and match["profile"] not in counts:
            counts[match["profile"]] = reader.resource(key) or 0
    return [
        (profile, count, reader.number(f"nvidia.com/mig-{profile}.memory", required=True))
        for profile, count in sorted(counts.items())
        if count > 0
    ]


def _full_gpu_count(reader: _Reader, replicas: int, *, has_mig: bool) -> int:
    """Cards without MIG. With MIG devices present only allocatable can tell (the count
    label then counts every card); time-slicing multiplies allocatable by the replicas."""
    allocated = reader.resource(NV_GPU_RESOURCE)
    if allocated is None:
        allocated = reader.resource(NV_SHARED_RESOURCE)
    if has_mig:
        if allocated is None:
            if not reader.has_allocatable:
                reader.missing.append(f"allocatable {NV_GPU_RESOURCE}")
            return 0
        return allocated // max(replicas, 1)
    count = reader.number(NV_COUNT)
    if count is None and allocated is not None:
        count = allocated // max(replicas, 1)
    if count is None:
        reader.missing.append(NV_COUNT)
    return count or 0


def _mig_devices(base: Gpu, kinds: list[tuple[str, int, int | None]], *, start: int) -> list[Gpu]:
    """Each MIG device as its own Gpu holding one partition: labels do not say which card
    holds which slice, and placement needs only the slice."""
    gpus: list[Gpu] = []
    for profile, count, memory_mib in kinds:
        if memory_mib is None:
            continue  # noted as missing; a slice of unknown size offers nothing
        for _ in range(count):
            memory = memory_mib * MIB
            gpus.append(
                replace(
                    base,
                    index=start + len(gpus),
                    memory_bytes=memory,
                    partitions=(Partition(profile=profile, memory_bytes=memory),),
                    mig_enabled=True,
                )
            )
    return gpus


def _read_sharing(parts: _Parts, reader: _Reader, replicas: int, raw_product: str) -> None:
    """Time-slicing / MPS as the admin configured it; none at all means sharing is not set up
    (whole-GPU placement plus a SharingNotConfigured notice on managed clusters)."""
    strategy = (reader.get(NV_SHARING) or "").lower()
    if not strategy and raw_product.endswith("-SHARED"):
        strategy = SharingStrategy.TIME_SLICING.value  # GFD before the sharing-strategy label
    if strategy == SharingStrategy.TIME_SLICING.value:
        parts.sharing_strategy = SharingStrategy.TIME_SLICING
        parts.sharing_replicas = replicas
        parts.sharing_configured = True
    elif strategy == SharingStrategy.MPS.value:
        parts.sharing_strategy = SharingStrategy.MPS
        parts.sharing_replicas = replicas
        parts.sharing_configured = True
    else:
        parts.sharing_configured = False


def _amd_node(reader: _Reader, host_bytes: int | None) -> _Parts:
    parts = _Parts(sharing_configured=False)
    counters = _amd_counters(reader)
    product = reader.get(AMD_PRODUCT) or _only(counters.get("product-name"))
    if product is None:
        reader.missing.append(AMD_PRODUCT)
    vram_text = reader.get(AMD_VRAM) or _only(counters.get("vram"))
    partition = (reader.get(AMD_PARTITION) or "").lower() or None
    base = Gpu(
        index=0,
        vendor=Vendor.AMD,
        product=product or "AMD GPU",
        driver_version=reader.get(AMD_DRIVER),
    )
    count = reader.resource(AMD_GPU_RESOURCE)
    if count is None and partition is not None:
        count = reader.resource(f"amd.com/{partition}")
    if count is None and "vram" in counters:
        count = sum(counters["vram"].values())
    if count is None:
        reader.missing.append(f"allocatable {AMD_GPU_RESOURCE}")
        count = 0
    if classify.is_unified_memory_product(Vendor.AMD, product or ""):
        parts.gpus = [replace(base, index=i) for i in range(max(count, 1))]
        parts.unified_memory_bytes = host_bytes
        parts.sharing_configured = None
        if host_bytes is None:
            reader.missing.append(CAPACITY_MEMORY)
        return parts
    vram = _amd_vram(vram_text)
    if vram is None:
        reader.missing.append(AMD_VRAM if vram_text is None else f"{AMD_VRAM} ({vram_text!r})")
    partitioned = partition is not None and partition != "spx_nps1"
    for index in range(count):
        parts.gpus.append(
            replace(
                base,
                index=index,
                memory_bytes=vram,
                partitions=(
                    (Partition(profile=partition, memory_bytes=vram),)
                    if partitioned and partition is not None and vram is not None
                    else ()
                ),
            )
        )
    return parts


def _amd_counters(reader: _Reader) -> dict[str, dict[str, int]]:
    """The labeller's counter form on mixed nodes: ``amd.com/gpu.vram.192G: "8"``."""
    counters: dict[str, dict[str, int]] = {}
    for key in reader.labels:
        match = _AMD_COUNTER.match(key)
        if match:
            counters.setdefault(match["name"], {})[match["value"]] = reader.number(key) or 0
    return counters


def _only(values: Mapping[str, int] | None) -> str | None:
    """The one value of a counter label, None when absent or when the node mixes kinds."""
    return next(iter(values)) if values and len(values) == 1 else None


def _amd_vram(text: str | None) -> int | None:
    """``192G`` → bytes. The labeller rounds MiB/1024 to whole GiB and writes "G"."""
    if text is None:
        return None
    match = re.fullmatch(r"(\d+)\s*G(?:i?B)?", text.strip(), flags=re.IGNORECASE)
    return int(match.group(1)) * GIB if match else None


def _own_node(reader: _Reader, vendor: Vendor, host_bytes: int | None) -> _Parts:
    """Our agent's labels (standalone clusters): the budgets it advertises are the GPUs."""
    parts = _Parts(unschedulable_reason=_mig_state_reason(reader), sharing_configured=True)
    product = reader.get(OUR_PRODUCT) or reader.get(NV_PRODUCT) or reader.get(AMD_PRODUCT)
    if product is None:
        reader.missing.append(OUR_PRODUCT)
    indices = sorted(
        int(match["index"])
        for key in reader.allocatable
        if (match := _OUR_VRAM_RESOURCE.match(key))
    )
    if not indices:
        count = reader.number(OUR_COUNT, required=True) or 0
        indices = list(range(count))
    base = Gpu(
        index=0,
        vendor=vendor,
        product=product or f"{vendor.value} GPU",
        accel_version=reader.get(OUR_ACCEL) or reader.get(NV_RUNTIME),
    )
    memory_class = (reader.get(OUR_MEMORY_CLASS) or "").lower()
    common_mib = reader.number(OUR_MEMORY_MIB)
    if memory_class == UNIFIED or (
        not memory_class and classify.is_unified_memory_product(vendor, product or "")
    ):
        parts.gpus = [replace(base, index=i) for i in indices or [0]]
        parts.unified_memory_bytes = common_mib * MIB if common_mib is not None else host_bytes
        if parts.unified_memory_bytes is None:
            reader.missing.append(OUR_MEMORY_MIB)
        return parts
    if memory_class != DISCRETE:
        reader.missing.append(OUR_MEMORY_CLASS)
    for index in indices:
        size_mib = reader.number(OUR_GPU_MEMORY_MIB.format(index=index))
        if size_mib is None:
            size_mib = common_mib
        memory = size_mib * MIB if size_mib is not None else None
        if memory is None:
            budget = reader.resource(OUR_VRAM_RESOURCE.format(index=index))
            memory = budget * GIB if budget is not None else None
            if memory is None:
                reader.missing.append(OUR_MEMORY_MIB)
        parts.gpus.append(replace(base, index=index, memory_bytes=memory))
    return parts
