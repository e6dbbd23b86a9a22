"""Hardware facts → hardware class and sharing class (docs/hardware.md).

Users never choose a class: fleet files, discovery adapters and node labels describe what is
there, and these functions name how it may be shared. `slots.py` applies them per device.
"""

from __future__ import annotations

import re

from cohabit.hardware.model import Fleet, HardwareClass, Node, SharingStrategy, Topology, Vendor

FRACTIONAL = "fractional"
WHOLE_GPU = "whole_gpu"
MPS = "mps"
UNIFIED_MEMORY = "unified_memory"
METAL_SPAWNER = "metal_spawner"
CPU = "cpu"

_NON_WORD = re.compile(r"[^a-z0-9]+")


def partition_sharing_class(vendor: Vendor, profile: str) -> str:
    """Sharing class of a hardware partition: ``mig_3g_20gb`` for MIG profile ``3g.20gb``.

    AMD partitions read ``partition_<profile>`` (e.g. ``partition_cpx_nps4``).
    """
    slug = _NON_WORD.sub("_", profile.lower()).strip("_")
    prefix = "mig" if vendor is Vendor.NVIDIA else "partition"
    return f"{prefix}_{slug}"


def time_slicing_sharing_class(replicas: int) -> str:
    """``time_slicing_4replicas`` for a GPU Operator time-slicing config with 4 replicas."""
    return f"time_slicing_{replicas}replicas"


def sharing_configured(fleet: Fleet, node: Node) -> bool:
    """Whether GPU sharing is set up for this node (only managed clusters can lack it)."""
    if fleet.topology is not Topology.MANAGED_CLUSTER:
        return True
    if node.sharing_configured is not None:
        return node.sharing_configured
    return fleet.sharing_configured


def discrete_sharing_class(fleet: Fleet, node: Node) -> str:
    """How a discrete card without partitions is shared on this node.

    Whole-GPU when fractional placement is off or a managed cluster has no sharing set up;
    otherwise the admin's strategy (time-slicing, MPS) or plain fractional budgets.
    """
    if not fleet.fractional or not sharing_configured(fleet, node):
        return WHOLE_GPU
    if node.sharing_strategy is SharingStrategy.TIME_SLICING:
        return time_slicing_sharing_class(node.sharing_replicas or 1)
    if node.sharing_strategy is SharingStrategy.MPS:
        return MPS
    return FRACTIONAL


def pool_classes(node: Node) -> tuple[HardwareClass, str]:
    """Hardware and sharing class of a node's memory pool (unified memory or CPU)."""
    if not node.is_unified:
        return HardwareClass.CPU, CPU
    if node.os == "macos" or any(gpu.vendor is Vendor.APPLE for gpu in node.gpus):
        return HardwareClass.UNIFIED_MEMORY, METAL_SPAWNER
    return HardwareClass.UNIFIED_MEMORY, UNIFIED_MEMORY


# Products whose GPU has no memory of its own and draws from the host's memory (docs/hardware.md
# unified_memory). NVML reports "Not Supported" for GB10 memory; AMD APUs report only a small
# BIOS carve-out as VRAM. Matched as whole words of the product name, any spelling of spaces
# and dashes ("NVIDIA GB10", GPU Feature Discovery's "NVIDIA-GB10").
_UNIFIED_PRODUCT_WORDS: dict[Vendor, tuple[str, ...]] = {
    Vendor.NVIDIA: ("gb10",),
    # Strix Halo (Ryzen AI Max: Radeon 8060S / 8050S) and the MI300A APU.
    Vendor.AMD: ("strix halo", "8060s", "8050s", "mi300a"),
}
# AMD graphics targets of unified-memory APUs, as amdsmi's `target_graphics_version` says.
_UNIFIED_AMD_TARGETS = frozenset({"gfx1151"})


def is_unified_memory_product(
    vendor: Vendor, product: str, *, graphics_target: str | None = None
) -> bool:
    """Whether this accelerator shares the host's memory instead of having its own.

    >>> is_unified_memory_product(Vendor.NVIDIA, "NVIDIA-GB10")
    True
    >>> is_unified_memory_product(Vendor.AMD, "AMD Radeon Graphics", graphics_target="gfx1151")
    True
    >>> is_unified_memory_product(Vendor.NVIDIA, "NVIDIA H100 80GB HBM3")
    False
    """
    if vendor is Vendor.APPLE:
        return True
    if graphics_target is not None and graphics_target.lower() in _UNIFIED_AMD_TARGETS:
        return vendor is Vendor.AMD
    words = f" {_NON_WORD.sub(' ', product.lower()).strip()} "
    return any(f" {word} " in words for word in _UNIFIED_PRODUCT_WORDS.get(vendor, ()))
