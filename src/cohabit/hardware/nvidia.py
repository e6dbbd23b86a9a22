"""NVIDIA discovery through NVML (`nvidia-ml-py`, imported lazily): GPUs, MIG instances, live
memory and processes → one `Node`. Called by `discover.py`; tests pass a pynvml-shaped fake.

Units at this edge: NVML memory info is bytes; MIG `memorySizeMB` is MiB; the CUDA driver
version is an integer (12040 → "12.4"). Identities: `nvmlDeviceGetUUID` gives ``GPU-…`` for a
card and ``MIG-…`` for a MIG device (what CUDA_VISIBLE_DEVICES accepts), and
`nvmlDeviceGetPciInfo(...).busId` the card's PCI address (``00000000:01:00.0``). NVML's
index order is PCI bus order, the order CUDA uses under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import math
from typing import Any

from cohabit.hardware import classify
from cohabit.hardware.errors import DiscoveryError
from cohabit.hardware.host import HostMemory, host_name, host_os, read_host_memory
from cohabit.hardware.model import Gpu, GpuProcess, Node, Notice, NoticeCode, Partition, Vendor
from cohabit.units import GIB, MIB

# NVML answers meaning "there is no NVIDIA stack here" rather than "it broke".
_ABSENT_ERRORS = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def discover_nvidia(
    nvml: Any = None,
    *,
    name: str | None = None,
    host: HostMemory | None = None,
) -> Node | None:
    """This machine's NVIDIA GPUs as a Node, or None when there is no NVML or no GPU.

    `nvml` is the `pynvml` module (imported here when None) or a fake with its shape. `host`
    sizes a unified-memory pool (GB10, whose NVML memory info is "Not Supported"); it is read
    from the machine when needed and not given.

    Raises:
        DiscoveryError: NVML is present but a call failed (GPU lost, no permission, ...).
    """
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None
        nvml = pynvml
    lib = _Nvml(nvml)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        if lib.code(exc) in lib.absent_codes:
            return None
        raise DiscoveryError("nvml", "nvmlInit", str(exc)) from None
    try:
        return _read_node(lib, name=name or host_name(), host=host)
    finally:
        nvml.nvmlShutdown()


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer as people write it.

    >>> cuda_version_text(12040), cuda_version_text(13000)
    ('12.4', '13.0')
    """
    return f"{version // 1000}.{version % 1000 // 10}"


def mig_profile_name(
    *, gpu_slices: int, compute_slices: int, memory_mib: int, parent_total_bytes: int
) -> str:
    """The MIG profile name the GPU Operator uses (``3g.40gb``, ``1c.3g.40gb``).

    The "gb" figure is the slice's share of the card, rounded up to eighths, times the card's
    size in whole GiB (rounded up), so a 40,192 MiB slice of an 81,559 MiB H100 reads 40gb.

    >>> mig_profile_name(gpu_slices=3, compute_slices=3, memory_mib=40192,
    ...                  parent_total_bytes=81559 * MIB)
    '3g.40gb'
    >>> mig_profile_name(gpu_slices=1, compute_slices=1, memory_mib=4864,
    ...                  parent_total_bytes=40960 * MIB)
    '1g.5gb'
    """
    share = memory_mib * MIB / parent_total_bytes
    eighths = math.ceil(share * 8) / 8
    card_gib = -(-parent_total_bytes // GIB)
    size_gb = int(eighths * card_gib + 0.5)
    if compute_slices == gpu_slices:
        return f"{gpu_slices}g.{size_gb}gb"
    return f"{compute_slices}c.{gpu_slices}g.{size_gb}gb"


class _Nvml:
    """The pynvml module with its errors turned into ours, naming the call that failed."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.absent_codes = {getattr(module, attr) for attr in _ABSENT_ERRORS}
        self.not_supported = module.NVML_ERROR_NOT_SUPPORTED
        self.not_found = module.NVML_ERROR_NOT_FOUND

    @staticmethod
    def code(exc: Exception) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self.module, function)(*args)
        except self.module.NVMLError as exc:
            raise DiscoveryError("nvml", function, str(exc)) from None

    def optional(self, function: str, *args: Any, missing: tuple[int, ...] = ()) -> Any:
        """Like `call`, but None where NVML says "Not Supported" (or a code in `missing`)."""
        try:
            return getattr(self.module, function)(*args)
        except self.module.NVMLError as exc:
            if self.code(exc) in (self.not_supported, *missing):
                return None
            raise DiscoveryError("nvml", function, str(exc)) from None


def _text(value: str | bytes) -> str:
    """pynvml returns str; releases before 11.5 returned bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _read_node(lib: _Nvml, *, name: str, host: HostMemory | None) -> Node | None:
    count = lib.call("nvmlDeviceGetCount")
    if not count:
        return None
    driver = _text(lib.call("nvmlSystemGetDriverVersion"))
    cuda = cuda_version_text(lib.call("nvmlSystemGetCudaDriverVersion"))
    gpus: list[Gpu] = []
    notices: list[Notice] = []
    pending: list[int] = []
    for index in range(count):
        handle = lib.call("nvmlDeviceGetHandleByIndex", index)
        gpu, mig_pending = _read_gpu(lib, handle, index=index, driver=driver, cuda=cuda)
        if mig_pending:
            pending.append(index)
        if gpu.mig_enabled and not gpu.partitions:
            notices.append(
                Notice(
                    code=NoticeCode.PARTIAL_DISCOVERY,
                    message=f"GPU {index} has MIG enabled but no MIG instances; left out",
                )
            )
            continue
        gpus.append(gpu)
    unknown_memory = [gpu for gpu in gpus if gpu.memory_bytes is None]
    unified = bool(gpus) and len(unknown_memory) == len(gpus)
    for gpu in unknown_memory:
        if not classify.is_unified_memory_product(Vendor.NVIDIA, gpu.product):
            what = "treated as unified memory" if unified else "its memory is unknown"
            notices.append(
                Notice(
                    code=NoticeCode.PARTIAL_DISCOVERY,
                    message=f"GPU {gpu.index} ({gpu.product}) reports no memory size; {what}",
                )
            )
    pool: HostMemory | None = None
    if unified:
        pool = host or read_host_memory()
    return Node(
        name=name,
        os=host_os(),
        gpus=tuple(gpus),
        unified_memory_bytes=pool.total_bytes if pool else None,
        free_memory_bytes=pool.available_bytes if pool else None,
        schedulable=not pending,
        unschedulable_reason=(
            f"MIG mode change pending on GPU {', '.join(map(str, pending))} (GPU reset needed)"
            if pending
            else None
        ),
        notices=tuple(notices),
    )


def _read_gpu(lib: _Nvml, handle: Any, *, index: int, driver: str, cuda: str) -> tuple[Gpu, bool]:
    """One GPU, and whether its MIG mode is about to change."""
    memory = lib.optional("nvmlDeviceGetMemoryInfo", handle)
    major, minor = lib.call("nvmlDeviceGetCudaComputeCapability", handle)
    mig_mode = lib.optional("nvmlDeviceGetMigMode", handle)
    enable = lib.module.NVML_DEVICE_MIG_ENABLE
    mig_enabled = None if mig_mode is None else mig_mode[0] == enable
    partitions: tuple[Partition, ...] = ()
    if mig_enabled and memory is not None:
        partitions = _read_mig(lib, handle, parent_total_bytes=int(memory.total))
    processes = lib.optional("nvmlDeviceGetComputeRunningProcesses", handle) or []
    pci = lib.optional("nvmlDeviceGetPciInfo", handle)
    gpu = Gpu(
        index=index,
        vendor=Vendor.NVIDIA,
        product=_text(lib.call("nvmlDeviceGetName", handle)),
        memory_bytes=None if memory is None else int(memory.total),
        accel_version=cuda,
        uuid=_text(lib.call("nvmlDeviceGetUUID", handle)),
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        compute_capability=f"{major}.{minor}",
        partitions=partitions,
        free_bytes=None if memory is None else int(memory.free),
        driver_version=driver,
        mig_enabled=mig_enabled,
        processes=tuple(
            GpuProcess(pid=int(proc.pid), used_bytes=_used_bytes(proc)) for proc in processes
        ),
    )
    return gpu, mig_mode is not None and mig_mode[0] != mig_mode[1]


def _used_bytes(proc: Any) -> int | None:
    used = getattr(proc, "usedGpuMemory", None)
    return None if used is None else int(used)


def _read_mig(lib: _Nvml, handle: Any, *, parent_total_bytes: int) -> tuple[Partition, ...]:
    """The MIG devices of one GPU, in NVML index order (empty slots are skipped)."""
    partitions: list[Partition] = []
    for slot in range(lib.call("nvmlDeviceGetMaxMigDeviceCount", handle)):
        mig = lib.optional(
            "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot, missing=(lib.not_found,)
        )
        if mig is None:
            continue
        attributes = lib.call("nvmlDeviceGetAttributes", mig)
        memory_mib = int(attributes.memorySizeMB)
        profile = mig_profile_name(
            gpu_slices=int(attributes.gpuInstanceSliceCount),
            compute_slices=int(attributes.computeInstanceSliceCount),
            memory_mib=memory_mib,
            parent_total_bytes=parent_total_bytes,
        )
        partitions.append(
            Partition(
                profile=profile,
                memory_bytes=memory_mib * MIB,
                uuid=_text(lib.call("nvmlDeviceGetUUID", mig)),
            )
        )
    return tuple(partitions)
