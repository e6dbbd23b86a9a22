"""AMD discovery through amdsmi (imported lazily): Instinct and Radeon GPUs, compute/memory
partitions and APUs (Strix Halo) → one `Node`. Called by `discover.py`; tests pass a fake.

Units at this edge: amdsmi's `vram_size`, `vram_total` and `vram_used` are MiB ("MB").

Identities (amdsmi py-interface/amdsmi_interface.py): a GPU's `uuid` is ROCr's, ``GPU-`` and
the card's unique id in 16 upper-case hex digits — the form ROCR_VISIBLE_DEVICES matches
(ROCR-Runtime amd_filter_device.cpp) — built from `amdsmi_get_gpu_asic_info()["asic_serial"]`
(that unique id, "0x%016X"); amdsmi's own `amdsmi_get_gpu_device_uuid` is a different,
generated string that ROCr does not accept. `pci_bus_id` is `amdsmi_get_gpu_device_bdf`.
GPU indices follow ROCr's enumeration, the KFD topology order
(`amdsmi_get_gpu_kfd_info()["node_id"]`), so an index that stands in for a UUID means the
same device to ROCR_VISIBLE_DEVICES.
"""

from __future__ import annotations

from typing import Any

from cohabit.hardware import classify
from cohabit.hardware.errors import DiscoveryError
from cohabit.hardware.host import HostMemory, host_name, host_os, read_host_memory
from cohabit.hardware.model import Gpu, Node, Partition, Vendor
from cohabit.units import MIB

# The default, unpartitioned mode: one logical GPU per card, all its memory in one pool.
_WHOLE_CARD = ("spx", "nps1")


def discover_amd(
    amdsmi: Any = None,
    *,
    name: str | None = None,
    host: HostMemory | None = None,
) -> Node | None:
    """This machine's AMD GPUs as a Node, or None when there is no amdsmi or no AMD GPU.

    In a partitioned mode (e.g. CPX + NPS4) amdsmi lists every partition as its own processor;
    each becomes a `Gpu` (index = ROCr's enumeration order) holding one hardware
    partition (`cpx_nps4`) of its memory. APUs (Strix Halo) make a unified-memory node sized
    from host memory; the BIOS carve-out amdsmi reports as VRAM is not added (it is not
    shared with the host, and the recommended setup for LLMs keeps it small).

    Raises:
        DiscoveryError: amdsmi initialised but a required call failed.
    """
    if amdsmi is None:
        try:
            import amdsmi as real_amdsmi
        except (ImportError, KeyError, OSError):  # the package is there but libamd_smi is not
            return None
        amdsmi = real_amdsmi
    try:
        amdsmi.amdsmi_init()
    except amdsmi.AmdSmiException:
        return None  # no amdgpu driver loaded: not an AMD machine
    try:
        return _read_node(_AmdSmi(amdsmi), name=name or host_name(), host=host)
    finally:
        amdsmi.amdsmi_shut_down()


class _AmdSmi:
    """The amdsmi module with its errors turned into ours, naming the call that failed."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self.module, function)(*args)
        except self.module.AmdSmiException as exc:
            raise DiscoveryError("amdsmi", function, str(exc)) from None

    def optional(self, function: str, *args: Any) -> Any:
        """None where the call is missing from this amdsmi or the device does not support it."""
        method = getattr(self.module, function, None)
        if method is None:
            return None
        try:
            return method(*args)
        except self.module.AmdSmiException:
            return None


def _read_node(lib: _AmdSmi, *, name: str, host: HostMemory | None) -> Node | None:
    handles = _in_rocr_order(lib, list(lib.call("amdsmi_get_processor_handles")))
    if not handles:
        return None
    rocm = _rocm_version(lib.optional("amdsmi_get_rocm_version"))
    gpus: list[Gpu] = []
    unified_flags: list[bool] = []
    for index, handle in enumerate(handles):
        asic = lib.call("amdsmi_get_gpu_asic_info", handle)
        product = str(asic.get("market_name") or "AMD GPU")
        target = asic.get("target_graphics_version")
        unified = classify.is_unified_memory_product(
            Vendor.AMD, product, graphics_target=str(target) if target else None
        )
        unified_flags.append(unified)
        vram_bytes = int(lib.call("amdsmi_get_gpu_vram_info", handle)["vram_size"]) * MIB
        usage = lib.optional("amdsmi_get_gpu_vram_usage", handle)
        free_bytes = (int(usage["vram_total"]) - int(usage["vram_used"])) * MIB if usage else None
        uuid = rocr_uuid(asic.get("asic_serial"))
        bdf = lib.optional("amdsmi_get_gpu_device_bdf", handle)
        driver = lib.optional("amdsmi_get_gpu_driver_info", handle)
        profile = _partition_profile(
            lib.optional("amdsmi_get_gpu_compute_partition", handle),
            lib.optional("amdsmi_get_gpu_memory_partition", handle),
        )
        partitions = (
            (Partition(profile=profile, memory_bytes=vram_bytes, uuid=uuid),)
            if profile and not unified
            else ()
        )
        gpus.append(
            Gpu(
                index=index,
                vendor=Vendor.AMD,
                product=product,
                memory_bytes=None if unified else vram_bytes,
                accel_version=rocm,
                uuid=uuid,
                pci_bus_id=str(bdf) if bdf else None,
                compute_capability=str(target) if target else None,
                partitions=partitions,
                free_bytes=None if unified else free_bytes,
                driver_version=str(driver["driver_version"]) if driver else None,
            )
        )
    pool: HostMemory | None = None
    if all(unified_flags):
        pool = host or read_host_memory()
    elif any(unified_flags):
        # An APU next to a discrete card: budget only the discrete ones.
        gpus = [gpu for gpu, unified in zip(gpus, unified_flags, strict=True) if not unified]
    return Node(
        name=name,
        os=host_os(),
        gpus=tuple(gpus),
        unified_memory_bytes=pool.total_bytes if pool else None,
        free_memory_bytes=pool.available_bytes if pool else None,
    )


def in_rocr_order(amdsmi: Any, handles: list[Any]) -> list[Any]:
    """`handles` of the `amdsmi` module in ROCr's order (the meter indexes GPUs as here)."""
    return _in_rocr_order(_AmdSmi(amdsmi), handles)


def _in_rocr_order(lib: _AmdSmi, handles: list[Any]) -> list[Any]:
    """The processors in ROCr's order (ascending KFD node id); amdsmi's own order when this
    amdsmi cannot say for every one of them."""
    node_ids: list[int] = []
    for handle in handles:
        info = lib.optional("amdsmi_get_gpu_kfd_info", handle)
        node_id = info.get("node_id") if isinstance(info, dict) else None
        if not isinstance(node_id, int):
            return handles
        node_ids.append(node_id)
    return [handle for _, handle in sorted(zip(node_ids, handles, strict=True), key=lambda p: p[0])]


def rocr_uuid(asic_serial: object) -> str | None:
    """ROCr's UUID for a card from amdsmi's `asic_serial`; None when the card has no unique
    id (ROCr then shows ``GPU-XX``, which selects nothing).

    >>> rocr_uuid("0x5F3A9C21D84E0003"), rocr_uuid("N/A"), rocr_uuid("0x0000000000000000")
    ('GPU-5F3A9C21D84E0003', None, None)
    """
    try:
        unique_id = int(str(asic_serial), 16)
    except ValueError:
        return None
    return f"GPU-{unique_id:016X}" if unique_id else None


def _rocm_version(answer: Any) -> str | None:
    """amdsmi_get_rocm_version() answers (ok, "6.4.1"); drop any build suffix ("-123")."""
    if not answer:
        return None
    ok, version = answer
    if not ok or not version:
        return None
    return str(version).split("-")[0]


def _partition_profile(compute: str | None, memory: str | None) -> str | None:
    """``cpx_nps4`` for a partitioned card, as AMD's node labeller spells it; None when whole.

    >>> _partition_profile("CPX", "NPS4"), _partition_profile("SPX", "NPS1")
    ('cpx_nps4', None)
    """
    parts = tuple(part.strip().lower() for part in (compute, memory) if part and part.strip())
    if not parts or parts == _WHOLE_CARD or parts == _WHOLE_CARD[:1]:
        return None
    return "_".join(parts)
