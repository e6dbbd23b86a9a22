"""Live memory use per device: what each GPU, MIG slice or memory pool holds right now, and
which processes hold it. The service's meter reads this every few seconds and attributes the
processes to deployments; `cohabit plan --measured` reads a recorded copy (`usage_from_json`).

Sources, per vendor (each library imported lazily, like discovery):
- NVIDIA, NVML (nvidia-ml-py's pynvml.py): `nvmlDeviceGetMemoryInfo` (a `c_nvmlMemory_t`:
  total/free/used bytes) and `nvmlDeviceGetComputeRunningProcesses` (v3: objects with `pid`,
  `usedGpuMemory` bytes — None where the driver cannot say, which pynvml maps from
  NVML_VALUE_NOT_AVAILABLE —, `gpuInstanceId`, `computeInstanceId`). With MIG on, both are
  asked of each MIG device handle (`nvmlDeviceGetMigDeviceHandleByIndex`), which answer for
  that slice alone; slots skipped the way discovery skips them keep partition indices equal.
- AMD, amdsmi (py-interface/amdsmi_interface.py): `amdsmi_get_gpu_vram_usage` (dict
  `vram_total`/`vram_used` in MiB) and `amdsmi_get_gpu_process_list` (dicts with `pid` and
  `memory_usage.vram_mem` in bytes, per include/amd_smi/amdsmi.h `amdsmi_proc_info_t`).
- CPU and unified-memory pools: the host's memory (total and available, `host.py`); the
  processes there are metered by their resident memory, which the caller reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cohabit.hardware.amd import in_rocr_order
from cohabit.hardware.host import HostMemory, read_host_memory
from cohabit.hardware.model import GpuProcess, Node, Vendor
from cohabit.hardware.slots import SlotKey
from cohabit.units import MIB, SizeError, parse_size


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceUsage:
    """One slot's device as measured: bytes in total, used and free, and the processes the
    driver lists on it (empty for pools, whose processes are metered by resident memory).
    `cohabit_bytes`: what cohabit's engines use there, when whoever measured has already
    attributed it (a node agent on Kubernetes); None leaves it to the meter."""

    node: str
    gpu_index: int | None
    partition_index: int | None
    total_bytes: int
    used_bytes: int
    free_bytes: int
    processes: tuple[GpuProcess, ...] = ()
    cohabit_bytes: int | None = None

    @property
    def key(self) -> SlotKey:
        return (self.node, self.gpu_index, self.partition_index)


def measure_node(node: Node, *, nvml: Any = None, amdsmi: Any = None) -> tuple[DeviceUsage, ...]:
    """Every slot of `node` (this machine) as measured now: its pool, or its GPUs by vendor.
    A vendor library that is missing measures nothing for its GPUs."""
    if node.is_unified or node.is_cpu_only:
        return (pool_usage(node.name, read_host_memory()),)
    vendors = {gpu.vendor for gpu in node.gpus}
    partitioned = {gpu.index for gpu in node.gpus if gpu.partitions}
    found: list[DeviceUsage] = []
    if Vendor.NVIDIA in vendors:
        found.extend(nvidia_usage(node.name, nvml=nvml))
    if Vendor.AMD in vendors:
        found.extend(amd_usage(node.name, partitioned=partitioned, amdsmi=amdsmi))
    return tuple(found)


def pool_usage(node: str, memory: HostMemory) -> DeviceUsage:
    """A node's memory pool: used is what new processes cannot get (total − available)."""
    available = memory.available_bytes if memory.available_bytes is not None else 0
    return DeviceUsage(
        node=node,
        gpu_index=None,
        partition_index=None,
        total_bytes=memory.total_bytes,
        used_bytes=max(0, memory.total_bytes - available),
        free_bytes=available,
    )


def nvidia_usage(node: str, *, nvml: Any = None) -> list[DeviceUsage]:
    """Each NVIDIA GPU, or each MIG slice of a GPU in MIG mode, as NVML measures it now."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return []
        nvml = pynvml
    nvml.nvmlInit()
    try:
        found: list[DeviceUsage] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if _mig_enabled(nvml, handle):
                found.extend(_mig_usage(nvml, node, index, handle))
            else:
                found.append(_nvml_device(nvml, node, index, None, handle))
        return found
    finally:
        nvml.nvmlShutdown()


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # "Not Supported": a card without MIG
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _mig_usage(nvml: Any, node: str, index: int, handle: Any) -> list[DeviceUsage]:
    found: list[DeviceUsage] = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError:  # NVML_ERROR_NOT_FOUND: an empty slot (discovery skips it too)
            continue
        found.append(_nvml_device(nvml, node, index, len(found), mig))
    return found


def _nvml_device(
    nvml: Any, node: str, index: int, partition: int | None, handle: Any
) -> DeviceUsage:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return DeviceUsage(
        node=node,
        gpu_index=index,
        partition_index=partition,
        total_bytes=int(memory.total),
        used_bytes=int(memory.used),
        free_bytes=int(memory.free),
        processes=tuple(
            GpuProcess(
                pid=int(proc.pid),
                used_bytes=None if proc.usedGpuMemory is None else int(proc.usedGpuMemory),
            )
            for proc in processes
        ),
    )


def amd_usage(
    node: str, *, partitioned: frozenset[int] | set[int] = frozenset(), amdsmi: Any = None
) -> list[DeviceUsage]:
    """Each AMD processor (a card, or one partition of a partitioned card) as amdsmi measures
    it now, indexed in ROCr's order as discovery indexes them. `partitioned`: the indices that
    discovery made one partition each (their slot is partition 0)."""
    if amdsmi is None:
        try:
            import amdsmi as real_amdsmi
        except (ImportError, KeyError, OSError):
            return []
        amdsmi = real_amdsmi
    amdsmi.amdsmi_init()
    try:
        handles = in_rocr_order(amdsmi, list(amdsmi.amdsmi_get_processor_handles()))
        found: list[DeviceUsage] = []
        for index, handle in enumerate(handles):
            vram = amdsmi.amdsmi_get_gpu_vram_usage(handle)
            total = int(vram["vram_total"]) * MIB
            used = int(vram["vram_used"]) * MIB
            found.append(
                DeviceUsage(
                    node=node,
                    gpu_index=index,
                    partition_index=0 if index in partitioned else None,
                    total_bytes=total,
                    used_bytes=used,
                    free_bytes=max(0, total - used),
                    processes=tuple(
                        GpuProcess(
                            pid=int(proc["pid"]),
                            used_bytes=int(proc["memory_usage"]["vram_mem"]),
                        )
                        for proc in amdsmi.amdsmi_get_gpu_process_list(handle)
                    ),
                )
            )
        return found
    finally:
        amdsmi.amdsmi_shut_down()


class UsageFileError(ValueError):
    """A recorded measurement that cannot be read; the message names the entry and field."""


def usage_from_json(data: object) -> tuple[Sequence[DeviceUsage], Mapping[SlotKey, int]]:
    """A recorded measurement: ``devices`` entries with node, gpu_index, partition_index,
    total, used, free (sizes as "16GiB" or bytes) and optionally ``cohabit`` (what cohabit's
    engines used there). Returns the devices and the cohabit bytes per slot key."""
    if not isinstance(data, Mapping) or not isinstance(data.get("devices"), list):
        raise UsageFileError("a measurement needs a `devices:` list")
    devices: list[DeviceUsage] = []
    cohabit: dict[SlotKey, int] = {}
    for number, entry in enumerate(data["devices"], start=1):
        where = f"devices[{number}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("node"), str):
            raise UsageFileError(f"{where}: needs `node:` (a name)")
        device = DeviceUsage(
            node=entry["node"],
            gpu_index=_index(entry, "gpu_index", where),
            partition_index=_index(entry, "partition_index", where),
            total_bytes=_size(entry, "total", where),
            used_bytes=_size(entry, "used", where),
            free_bytes=_size(entry, "free", where),
        )
        devices.append(device)
        if entry.get("cohabit") is not None:
            cohabit[device.key] = _size(entry, "cohabit", where)
    return devices, cohabit


def _index(entry: Mapping[str, Any], name: str, where: str) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageFileError(f"{where}.{name}: {value!r} is not a device index")
    return value


def _size(entry: Mapping[str, Any], name: str, where: str) -> int:
    try:
        return parse_size(entry.get(name), field=f"{where}.{name}")
    except SizeError as err:
        raise UsageFileError(str(err)) from None
