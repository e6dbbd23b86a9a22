"""Filters: one function per rule, each judging one slot for one request and returning
None (pass) or a `Reason` (docs/placement.md order: vendor, accelerator version, class rules,
capacity). The planner applies the static ones per group of alike slots; the diagnosis
applies them per slot to count what was turned down and why.
"""

from __future__ import annotations

from collections.abc import Callable

from cohabit.hardware.model import HardwareClass, version_at_least
from cohabit.hardware.slots import Slot, SlotKind
from cohabit.placement.reasons import FilterCode, Reason
from cohabit.placement.request import PlacementRequest


def vendor_filter(request: PlacementRequest, slot: Slot) -> Reason | None:
    """The slot's vendor must be one the request (and its engine) accepts."""
    if slot.vendor in request.eligible_vendors():
        return None
    return Reason(
        code=FilterCode.VENDOR_MISMATCH,
        location=slot.location,
        detail=f"{slot.vendor.value} device",
    )


def accel_version_filter(request: PlacementRequest, slot: Slot) -> Reason | None:
    """CUDA / ROCm version at least the request's minimum (numeric per component)."""
    minimum = request.min_accel_version
    if minimum is None or version_at_least(slot.accel_version, minimum):
        return None
    return Reason(
        code=FilterCode.ACCEL_VERSION_UNMET,
        location=slot.location,
        detail=f"has {slot.accel_version or 'unknown'}, needs {minimum}",
    )


def class_filter(request: PlacementRequest, slot: Slot) -> Reason | None:
    """Class rules that do not depend on what is reserved: the node must be schedulable
    (not mid-MIG-reconfiguration), and tensor-parallel shards go on whole GPUs only — not on
    hardware partitions or memory pools."""
    if not slot.schedulable:
        return Reason(
            code=FilterCode.UNSCHEDULABLE,
            location=slot.location,
            detail=slot.unschedulable_reason or "",
        )
    if request.tensor_parallel > 1 and slot.kind is not SlotKind.GPU:
        return Reason(code=FilterCode.NOT_SPLITTABLE, location=slot.location)
    return None


def capacity_filter(request: PlacementRequest, slot: Slot, free_bytes: int) -> Reason | None:
    """Free budget at least the per-shard request; an exclusive slot must also be empty."""
    if slot.exclusive and free_bytes < slot.capacity_bytes:
        code = FilterCode.DEVICE_TAKEN
    elif free_bytes >= request.vram_bytes:
        return None
    elif slot.kind is SlotKind.POOL:
        code = FilterCode.INSUFFICIENT_SYSTEM_MEMORY
    else:
        code = FilterCode.INSUFFICIENT_GPU_MEMORY
    return Reason(
        code=code,
        location=slot.location,
        requested_bytes=request.vram_bytes,
        free_bytes=free_bytes,
        capacity_bytes=slot.capacity_bytes,
    )


StaticFilter = Callable[[PlacementRequest, Slot], Reason | None]
STATIC_FILTERS: tuple[StaticFilter, ...] = (vendor_filter, accel_version_filter, class_filter)


def static_reason(request: PlacementRequest, slot: Slot) -> Reason | None:
    """The first static filter that turns the slot down, or None."""
    for check in STATIC_FILTERS:
        reason = check(request, slot)
        if reason is not None:
            return reason
    return None


def is_memory_pool(slot: Slot) -> bool:
    """Unified-memory and CPU pools: what `insufficient_system_memory` is about."""
    return slot.hardware_class in (HardwareClass.UNIFIED_MEMORY, HardwareClass.CPU)
