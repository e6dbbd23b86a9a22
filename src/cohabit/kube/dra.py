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

from collections.abc import Mapping, Sequence
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
STEP = f"{GIB}"
# Attributes every device carries (names in the driver's domain, C identifiers).
ATTRIBUTE_ID = "id"  # the device's name, distinct within a node: what keeps shards apart
ATTRIBUTE_GPU_UUID = "gpuUUID"  # the card's UUID (a partition's card), where known


def slice_name(node_name: str, part: str = "devices") -> str:
    return f"{node_name}-{DRIVER}-{part}"


def device_name(slot: Slot) -> str:
    """ "gpu-0", "gpu-1-part-2", "pool": a DNS label, stable while the hardware is."""
    if slot.kind is SlotKind.POOL:
        return "pool"
    if slot.kind is SlotKind.PARTITION:
        return f"gpu-{slot.gpu_index}-part-{slot.partition_index}"
    return f"gpu-{slot.gpu_index}"


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
    return str(size_bytes)


def node_slices(
    node: Node,
    *,
    whole_gpus: bool = False,
    generation: int = 1,
    owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The node's pool as ResourceSlices: the devices, and the counter sets when a GPU is
    partitioned. `whole_gpus` (fractional placement off): every device is allocated whole.
    `generation` is the pool's (raise it whenever the slices change); `owner` the Node
    object, so the slices go when the Node does."""
    partitioned = {gpu.index: gpu for gpu in node.gpus if gpu.partitions}
    devices = [
        _device(slot, partitioned.get(slot.gpu_index) if slot.gpu_index is not None else None)
        for slot in published_slots(node, whole_gpus=whole_gpus).values()
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
