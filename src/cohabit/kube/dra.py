"""GPU memory as Dynamic Resource Allocation sees it: pure builders of `resource.k8s.io/v1`
wire JSON for the driver `gpu.cohabit.dev`, and the reading of what the kube-scheduler
allocated.

- `node_slices(node)`: the node's pool, one ResourceSlice of devices (the slots of
  `hardware.slots`: each GPU, each hardware partition, a unified pool) and, where a GPU is
  partitioned, a second slice of counter sets. A shared GPU or pool has
  `allowMultipleAllocations` and a `memory` capacity whose request policy is the budget unit
  (minimum and step 1 GiB), so several claims each consume part of it (consumable capacity).
  A partitioned GPU is offered whole (one allocation) and as its partitions; each of them
  draws on the GPU's `memory` counter, the whole card all of it, so the card lent whole and
  any of its partitions are never both allocated (partitionable devices).
- `offered_elsewhere(node, slices, allocatable)`: the node's GPUs another DRA driver's slice
  names, or a vendor's device plugin offers, which `node_slices` then leaves out.
- `device_class()`: the DeviceClass selecting this driver's devices.
- `memory_claim(...)`: a deployment's budget as a ResourceClaim asking `memory` of one device
  per shard, the shards on distinct devices.
- `allocated(claim)`: the devices, shares and consumed memory in the claim's status.

Field names and rules are the API's own (k8s.io/api resource/v1/types.go): a slice holds
devices or shared counters, never both; a request policy needs `allowMultipleAllocations`;
the policy's minimum plus its step must fit the capacity; attribute and capacity names
without a domain are in the driver's; `distinctAttribute` constraints and multiple
allocations need the DRAConsumableCapacity feature (beta, on by default, since 1.36), counters
need DRAPartitionableDevices (beta, on by default, since 1.36).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cohabit.hardware import classify
from cohabit.hardware.model import Fleet, Gpu, HardwareClass, Node, Vendor
from cohabit.hardware.slots import Slot, SlotKind, slots_of
from cohabit.units import GIB, gib_ceil, gib_floor, parse_size

API_VERSION = "resource.k8s.io/v1"
# The chart's `placement.backend`, as the operator and the control plane read it.
PLACEMENT_BACKEND_ENV = "COHABIT_PLACEMENT_BACKEND"
DRA_BACKEND = "dra"
DRIVER = "gpu.cohabit.dev"
DEVICE_CLASS = DRIVER
MEMORY = "memory"
# The budget unit: claims ask whole GiB, as the extended resources count them.
STEP = "1Gi"
# Attributes every device carries (names in the driver's domain, C identifiers).
ATTRIBUTE_ID = "id"  # the device's name, distinct within a node: what keeps shards apart
ATTRIBUTE_GPU_UUID = "gpuUUID"  # the card's UUID (a partition's card), where known
# The standard attribute naming a device's PCI address, extended BDF notation
# (k8s.io/dynamic-resource-allocation deviceattribute/attribute.go).
ATTRIBUTE_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# The domains of the resources a vendor's device plugin (or one built on it: HAMi's, the
# MIG and time-slicing resources of NVIDIA's) hands out on a node.
DEVICE_PLUGIN_DOMAINS = {Vendor.NVIDIA: "nvidia.com/", Vendor.AMD: "amd.com/"}
_PCI = re.compile(
    r"^(?P<domain>[0-9a-f]{1,8}):(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})\.(?P<fn>[0-7])$"
)


def slice_name(node_name: str, part: str = "devices") -> str:
    return f"{node_name}-{DRIVER}-{part}"


def device_name(slot: Slot) -> str:
    """ "gpu-0", "gpu-1-part-2", "pool": a DNS label, stable while the hardware is."""
    if slot.kind is SlotKind.POOL:
        return "pool"
    if slot.kind is SlotKind.PARTITION:
        return f"gpu-{slot.gpu_index}-part-{slot.partition_index}"
    return f"gpu-{slot.gpu_index}"


_DEVICE_NAME = re.compile(r"^gpu-(?P<gpu>\d+)(?:-part-(?P<part>\d+))?$")


def device_slot(name: str) -> tuple[int | None, int | None] | None:
    """What a device name of ours stands for (`device_name`, inverted): (GPU index,
    partition index or None), (None, None) for the unified pool, None for another name."""
    if name == "pool":
        return None, None
    match = _DEVICE_NAME.match(name)
    if match is None:
        return None
    part = match["part"]
    return int(match["gpu"]), None if part is None else int(part)


def published_slots(node: Node, *, whole_gpus: bool = False) -> dict[str, Slot]:
    """The devices `node_slices` publishes, by name, as slots: every slot of the node but a
    CPU pool, and each partitioned GPU lent whole (a slot of its own here, kind GPU)."""
    fleet = Fleet(nodes=(node,), fractional=not whole_gpus)
    slots = [slot for slot in slots_of(fleet) if slot.vendor is not Vendor.CPU]
    cards = {gpu.index: gpu for gpu in node.gpus}
    found: dict[str, Slot] = {}
    for slot in slots:
        if slot.kind is SlotKind.PARTITION and slot.gpu_index is not None:
            whole = _whole_card(slot, cards[slot.gpu_index])
            found.setdefault(device_name(whole), whole)
    found.update((device_name(slot), slot) for slot in slots)
    return dict(sorted(found.items()))


def _counter_set(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-memory"


def _quantity(size_bytes: int) -> str:
    """Whole GiB as "15Gi", what `kubectl` then shows; else bytes."""
    if size_bytes and size_bytes % GIB == 0:
        return f"{size_bytes // GIB}Gi"
    return str(size_bytes)


def node_slices(
    node: Node,
    *,
    whole_gpus: bool = False,
    generation: int = 1,
    owner: Mapping[str, Any] | None = None,
    withdrawn: Collection[int] = (),
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlices: the devices, and the counter sets when a GPU is
    partitioned. `whole_gpus` (fractional placement off): every device is allocated whole.
    `generation` is the pool's (raise it whenever the slices change); `owner` the Node
    object, so the slices go when the Node does. The GPUs indexed in `withdrawn` (another
    driver offers them: `offered_elsewhere`) are left out, their partitions with them, and
    a unified pool with any of its GPUs."""
    partitioned = {
        gpu.index: gpu for gpu in node.gpus if gpu.partitions and gpu.index not in withdrawn
    }
    devices = [
        _device(slot, partitioned.get(slot.gpu_index) if slot.gpu_index is not None else None)
        for slot in published_slots(node, whole_gpus=whole_gpus).values()
        if not _left_out(slot, withdrawn)
    ]
    counters = [
        {
            "name": _counter_set(gpu.index),
            "counters": {MEMORY: {"value": _quantity(card_bytes(gpu))}},
        }
        for gpu in sorted(partitioned.values(), key=lambda g: g.index)
    ]
    pool = {"name": node.name, "generation": generation, "resourceSliceCount": 1 + bool(counters)}
    slices = [_slice(node.name, "devices", pool, owner, {"devices": devices})]
    if counters:
        slices.append(_slice(node.name, "counters", pool, owner, {"sharedCounters": counters}))
    return slices


def _left_out(slot: Slot, withdrawn: Collection[int]) -> bool:
    """A unified pool is all of its GPUs: any of them withdrawn withdraws it."""
    if slot.kind is SlotKind.POOL:
        return bool(withdrawn)
    return slot.gpu_index in withdrawn


def _slice(
    node_name: str,
    part: str,
    pool: Mapping[str, Any],
    owner: Mapping[str, Any] | None,
    content: Mapping[str, Any],
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": slice_name(node_name, part)}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {"driver": DRIVER, "nodeName": node_name, "pool": dict(pool), **content},
    }


def card_bytes(gpu: Gpu) -> int:
    """A partitioned GPU's memory: the card's, else the sum of its partitions'."""
    return gpu.memory_bytes or sum(part.memory_bytes for part in gpu.partitions)


def _attributes(**values: str | int | None) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        if value is None:
            continue
        found[name] = {"int": value} if isinstance(value, int) else {"string": value}
    return found


def _device(slot: Slot, partitioned: Gpu | None) -> dict[str, Any]:
    name = device_name(slot)
    capacity_bytes = gib_floor(slot.capacity_bytes) * GIB
    device: dict[str, Any] = {
        "name": name,
        "attributes": _attributes(
            **{ATTRIBUTE_ID: name, ATTRIBUTE_GPU_UUID: slot.gpu_uuid},
            kind=slot.kind.value,
            vendor=slot.vendor.value,
            product=slot.product,
            uuid=slot.device_uuid,
            index=slot.gpu_index,
            profile=slot.partition_profile,
            accelVersion=slot.accel_version,
            hardwareClass=slot.hardware_class.value,
            sharingClass=slot.sharing_class,
        ),
        "capacity": {MEMORY: {"value": _quantity(capacity_bytes)}},
    }
    if not slot.exclusive and capacity_bytes >= 2 * GIB:
        device["allowMultipleAllocations"] = True
        device["capacity"][MEMORY]["requestPolicy"] = {
            "default": STEP,
            "validRange": {"min": STEP, "step": STEP},
        }
    if partitioned is not None:
        device["consumesCounters"] = [
            {
                "counterSet": _counter_set(partitioned.index),
                "counters": {MEMORY: {"value": _quantity(slot.total_bytes)}},
            }
        ]
    return device


def _whole_card(partition: Slot, gpu: Gpu) -> Slot:
    """A partitioned GPU lent whole, as a slot: one allocation of all of the card."""
    total = card_bytes(gpu)
    return replace(
        partition,
        kind=SlotKind.GPU,
        partition_index=None,
        partition_profile=None,
        gpu_uuid=gpu.uuid,
        device_uuid=gpu.uuid,
        hardware_class=HardwareClass.HARDWARE_ISOLATED,
        sharing_class=classify.WHOLE_GPU,
        total_bytes=total,
        capacity_bytes=total,
        exclusive=True,
    )


def offered_elsewhere(
    node: Node, slices: Sequence[Mapping[str, Any]], allocatable: Mapping[str, str]
) -> dict[int, str]:
    """The node's GPUs (by index) that something else offers too, and who: another DRA
    driver whose ResourceSlice (any of `slices`, the node's) has a device naming the card,
    or a partition of it, by a string attribute equal to its UUID or its PCI address; else
    the vendor's device plugin, when the Node's `allocatable` has any of its resources
    (`nvidia.com/gpu`, `nvidia.com/mig-*`, HAMi's `nvidia.com/gpumem`, `amd.com/gpu`...),
    which may hand out any card of that vendor. Our own slices are not counted.

    NVIDIA's driver `gpu.nvidia.com` names a card by `uuid`, and a MIG device by `uuid` (the
    MIG UUID) and `parentUUID` (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin
    deviceinfo.go and mig.go); drivers that follow the standard attributes name it by
    `resource.kubernetes.io/pciBusID`. Matching values, whatever the attribute's name,
    covers them all."""
    identities: dict[str, int] = {}
    for gpu in node.gpus:
        for identity in (gpu.uuid, _pci_address(gpu.pci_bus_id or "")):
            if identity:
                identities[identity] = gpu.index
        for part in gpu.partitions:
            if part.uuid:
                identities[part.uuid] = gpu.index
    found: dict[int, str] = {}
    for body in sorted(slices, key=lambda each: str(each["metadata"]["name"])):
        spec = body.get("spec") or {}
        driver = str(spec.get("driver", ""))
        if driver == DRIVER:
            continue
        for device in spec.get("devices") or []:
            for attribute in (device.get("attributes") or {}).values():
                value = str(attribute.get("string") or "")
                index = identities.get(value, identities.get(_pci_address(value)))
                if index is not None:
                    found.setdefault(index, f"DRA driver {driver}")
    for gpu in node.gpus:
        domain = DEVICE_PLUGIN_DOMAINS.get(gpu.vendor)
        offered = sorted(
            name
            for name, quantity in allocatable.items()
            if domain and name.startswith(domain) and str(quantity).strip() not in ("", "0")
        )
        if offered:
            found.setdefault(gpu.index, f"device plugin {offered[0]}")
    return dict(sorted(found.items()))


def _pci_address(text: str) -> str:
    """A PCI address in one form ("0000:3b:00.0"), whatever the domain's width and the
    case ("00000000:3B:00.0" as NVML writes it); "" for anything else."""
    match = _PCI.match(text.strip().lower())
    if match is None:
        return ""
    return f"{int(match['domain'], 16):04x}:{match['bus']}:{match['device']}.{match['fn']}"


def device_class() -> dict[str, Any]:
    """The DeviceClass claims name: every device of this driver."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def memory_claim(
    *,
    name: str,
    namespace: str,
    shards: int,
    bytes_per_shard: int,
    selectors: Sequence[str] = (),
) -> dict[str, Any]:
    """A ResourceClaim for `shards` devices of one node with `bytes_per_shard` of memory each
    (whole GiB, rounded up), on distinct devices, any the scheduler finds room on. A device
    that cannot be shared (a partition, a card lent whole) is taken whole when its memory
    covers the shard: CEL `selectors` narrow the candidates further."""
    gib = gib_ceil(bytes_per_shard)
    expressions = [_covers(gib), *selectors]
    request = {
        "name": "gpu",
        "exactly": {
            **_memory_request(expressions, gib),
            "allocationMode": "ExactCount",
            "count": shards,
        },
    }
    devices: dict[str, Any] = {"requests": [request]}
    if shards > 1:
        # The allocator already gives one request's devices distinct (1.37); the
        # constraint makes that rule ours.
        devices["constraints"] = [
            {"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/{ATTRIBUTE_ID}"}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": devices},
    }


def pinned_claim_spec(shards: Sequence[tuple[Slot, int]]) -> dict[str, Any]:
    """A claim's spec asking, for each (slot, bytes) of a placement cohabit decided, that
    much memory (whole GiB, rounded up) of that very device: a GPU or pool by its name, a
    partition by its card and profile (partitions of one profile are interchangeable)."""
    requests = []
    for index, (slot, size) in enumerate(shards):
        gib = gib_ceil(size)
        requests.append(
            {"name": f"shard-{index}", "exactly": _memory_request([device_selector(slot)], gib)}
        )
    return {"devices": {"requests": requests}}


def device_selector(slot: Slot) -> str:
    """CEL naming the published device(s) that are this slot."""
    attributes = f'device.attributes["{DRIVER}"]'
    if slot.kind is SlotKind.PARTITION:
        return (
            f'{attributes}.kind == "{SlotKind.PARTITION.value}" && '
            f"{attributes}.index == {slot.gpu_index} && "
            f'{attributes}.profile == "{slot.partition_profile}"'
        )
    return f'{attributes}.{ATTRIBUTE_ID} == "{device_name(slot)}"'


def _covers(gib: int) -> str:
    return f'device.capacity["{DRIVER}"].{MEMORY}.compareTo(quantity("{gib}Gi")) >= 0'


def _memory_request(expressions: Sequence[str], gib: int) -> dict[str, Any]:
    return {
        "deviceClassName": DEVICE_CLASS,
        "selectors": [{"cel": {"expression": text}} for text in expressions],
        "capacity": {"requests": {MEMORY: f"{gib}Gi"}},
    }


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of a claim's allocation: the claim's request it answers, the node (the
    pool), the device, the share of it (None for a device taken whole) and the memory the
    claim consumes on it (None: all)."""

    request: str
    node: str
    device: str
    share_id: str | None
    memory_bytes: int | None


def allocated(claim: Mapping[str, Any]) -> list[AllocatedDevice]:
    """What the scheduler allocated for the claim (empty while nothing is)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    found = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != DRIVER:
            continue
        consumed = (result.get("consumedCapacity") or {}).get(MEMORY)
        found.append(
            AllocatedDevice(
                request=str(result.get("request", "")),
                node=str(result.get("pool", "")),
                device=str(result.get("device", "")),
                share_id=result.get("shareID"),
                memory_bytes=None if consumed is None else parse_size(str(consumed)),
            )
        )
    return found
