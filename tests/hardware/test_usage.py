"""Live memory per device, read through the vendors' own Python bindings.

NVIDIA: the real `pynvml` module runs, with its C library replaced by recorded answers
(tests/fixtures/hardware/nvml_usage_h100_mig.json): each NVML C function writes what the
driver wrote into pynvml's own ctypes structs (`c_nvmlMemory_t`, `c_nvmlProcessInfo_v3_t`),
so pynvml's two-call process listing, its NVML_VALUE_NOT_AVAILABLE → None mapping and its
error classes are the library's, not ours. AMD: amdsmi's process list and VRAM usage
dicts with the keys py-interface/amdsmi_interface.py builds (`memory_usage.vram_mem` bytes,
`vram_total`/`vram_used` MiB). Pools: /proc/meminfo figures.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from cohabit.hardware.amd import in_rocr_order
from cohabit.hardware.host import HostMemory
from cohabit.hardware.model import GpuProcess
from cohabit.hardware.usage import (
    DeviceUsage,
    UsageFileError,
    amd_usage,
    nvidia_usage,
    pool_usage,
    usage_from_json,
)
from cohabit.units import GIB, MIB
from tests.hardware import fakes

NVML_SUCCESS = 0
NVML_ERROR_INSUFFICIENT_SIZE = 7


class RecordedNvmlLib:
    """libnvidia-ml as pynvml calls it (`getattr(nvmlLib, name)(...)`), answering from a
    recording. Device handles are pointers whose value encodes (GPU, MIG slot)."""

    def __init__(self, recording: dict[str, Any], pids: dict[str, int]) -> None:
        self.devices: list[dict[str, Any]] = recording["devices"]
        self.pids = pids

    @staticmethod
    def _handle_value(gpu: int, mig: int | None) -> int:
        return 0x10000 + gpu * 0x100 + (0 if mig is None else mig + 1)

    def _device(self, handle: Any) -> dict[str, Any]:
        value = ctypes.cast(handle, ctypes.c_void_p).value or 0
        gpu, mig = (value - 0x10000) // 0x100, (value - 0x10000) % 0x100
        device = self.devices[gpu]
        return device if mig == 0 else device["mig_devices"][mig - 1]

    @staticmethod
    def _set_handle(ref: Any, value: int) -> None:
        pointer = ref._obj  # byref() keeps the object it points at
        ctypes.memmove(
            ctypes.addressof(pointer),
            ctypes.byref(ctypes.c_void_p(value)),
            ctypes.sizeof(ctypes.c_void_p),
        )

    def __getattr__(self, name: str) -> Callable[..., int]:
        raise AttributeError(name)  # pynvml turns this into NVML_ERROR_FUNCTION_NOT_FOUND

    def nvmlInitWithFlags(self, flags: int) -> int:  # noqa: N802 — NVML's C names
        return NVML_SUCCESS

    def nvmlShutdown(self) -> int:  # noqa: N802
        return NVML_SUCCESS

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:  # noqa: N802
        count._obj.value = len(self.devices)
        return NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:  # noqa: N802
        self._set_handle(device, self._handle_value(index.value, None))
        return NVML_SUCCESS

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:  # noqa: N802
        answer = self._device(handle)["nvmlDeviceGetMigMode"]
        if isinstance(answer, dict):
            return int(answer["error"])
        current._obj.value, pending._obj.value = answer
        return NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:  # noqa: N802
        count._obj.value = self._device(handle)["nvmlDeviceGetMaxMigDeviceCount"]
        return NVML_SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> int:  # noqa: N802
        value = ctypes.cast(handle, ctypes.c_void_p).value or 0
        gpu = (value - 0x10000) // 0x100
        entry = self.devices[gpu]["mig_devices"][index.value]
        if set(entry) == {"error"}:
            return int(entry["error"])
        self._set_handle(mig, self._handle_value(gpu, index.value))
        return NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:  # noqa: N802
        answer = self._device(handle)["nvmlDeviceGetMemoryInfo"]
        for field in ("total", "free", "used"):
            setattr(memory._obj, field, answer[field])
        return NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(  # noqa: N802
        self, handle: Any, count: Any, processes: Any
    ) -> int:
        answer = self._device(handle)["nvmlDeviceGetComputeRunningProcesses_v3"]
        if processes is None:  # pynvml asks for the size first
            count._obj.value = len(answer)
            return NVML_ERROR_INSUFFICIENT_SIZE if answer else NVML_SUCCESS
        for slot, process in zip(processes, answer, strict=False):
            slot.pid = self.pids.get(process["pid"], process["pid"])
            slot.usedGpuMemory = process["usedGpuMemory"]
            slot.gpuInstanceId = process["gpuInstanceId"]
            slot.computeInstanceId = process["computeInstanceId"]
        count._obj.value = len(answer)
        return NVML_SUCCESS


def recorded_nvml(
    monkeypatch: pytest.MonkeyPatch, pids: dict[str, int] | None = None
) -> RecordedNvmlLib:
    """Install the recording as pynvml's loaded library; returns it."""
    recording = json.loads(fakes.fixture_path("nvml_usage_h100_mig.json").read_text())
    lib = RecordedNvmlLib(recording, pids or {"ENGINE": 4242, "ENGINE_CHILD": 4243})
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    return lib


def test_nvml_reads_each_mig_slice_and_each_whole_card(monkeypatch: pytest.MonkeyPatch) -> None:
    recorded_nvml(monkeypatch)

    found = nvidia_usage("node-a", nvml=pynvml)

    assert [d.key for d in found] == [("node-a", 0, 0), ("node-a", 0, 1), ("node-a", 1, None)]
    first, second, card = found
    assert (first.total_bytes, first.used_bytes, first.free_bytes) == (
        42144366592,
        17716396032,
        24427970560,
    )
    assert first.processes == (
        GpuProcess(pid=4242, used_bytes=14 * GIB),
        GpuProcess(pid=4243, used_bytes=2 * GIB),
    )
    # The empty MIG slot between the two is skipped, as discovery skips it: the 1g.10gb
    # instance is partition 1 in both.
    assert second.processes == (GpuProcess(pid=48213, used_bytes=4608 * MIB),)
    # NVML_VALUE_NOT_AVAILABLE: pynvml says None, and so do we.
    assert card.processes == (GpuProcess(pid=4242, used_bytes=None),)
    assert card.used_bytes == 18013323264


def test_nvml_without_a_library_raises_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not loaded and not loadable: pynvml's NVMLError reaches the meter, which logs it."""
    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "CDLL", _no_library)
    with pytest.raises(pynvml.NVMLError):
        nvidia_usage("node-a", nvml=pynvml)


def _no_library(name: str) -> Any:
    raise OSError(f"{name}: cannot open shared object file")


def test_amdsmi_reads_vram_and_process_lists_in_rocr_order() -> None:
    """amdsmi answers as amdsmi_interface.py shapes them; the partitioned MI300X's
    processors become partition 0 of each index, as discovery made them."""
    lib = fakes.amdsmi("amdsmi_mi300x_cpx.json")
    processors = lib.snapshot["processors"]
    lists = {
        0: [
            {
                "name": "llama-server",
                "pid": 5150,
                "mem": 3 * GIB,
                "engine_usage": {"gfx": 1200, "enc": 0},
                "memory_usage": {"gtt_mem": 2 * MIB, "cpu_mem": 40 * MIB, "vram_mem": 3 * GIB},
            }
        ]
    }
    lib.amdsmi_get_gpu_process_list = lambda handle: lists.get(handle, [])  # type: ignore[attr-defined]

    found = amd_usage("node-b", partitioned=set(range(len(processors))), amdsmi=lib)

    order = in_rocr_order(lib, list(range(len(processors))))
    assert [d.key for d in found] == [("node-b", i, 0) for i in range(len(processors))]
    for device, handle in zip(found, order, strict=True):
        usage = processors[handle]["amdsmi_get_gpu_vram_usage"]
        assert device.total_bytes == usage["vram_total"] * MIB
        assert device.used_bytes == usage["vram_used"] * MIB
        assert device.free_bytes == device.total_bytes - device.used_bytes
        engines = (GpuProcess(pid=5150, used_bytes=3 * GIB),) if handle == 0 else ()
        assert device.processes == engines


def test_a_pool_counts_what_new_processes_cannot_get_as_used() -> None:
    usage = pool_usage("host", HostMemory(total_bytes=24 * GIB, available_bytes=20 * GIB))
    assert (usage.key, usage.used_bytes, usage.free_bytes) == (
        ("host", None, None),
        4 * GIB,
        20 * GIB,
    )


def test_a_recorded_measurement_reads_sizes_with_units() -> None:
    devices, cohabit = usage_from_json(
        {
            "devices": [
                {"node": "node-a", "gpu_index": 0, "total": "80GiB", "used": "10GiB",
                 "free": "70GiB", "cohabit": "6GiB"},
                {"node": "host", "total": 1024, "used": 0, "free": 1024},
            ]
        }
    )  # fmt: skip
    assert devices == [
        DeviceUsage(
            node="node-a",
            gpu_index=0,
            partition_index=None,
            total_bytes=80 * GIB,
            used_bytes=10 * GIB,
            free_bytes=70 * GIB,
        ),
        DeviceUsage(
            node="host",
            gpu_index=None,
            partition_index=None,
            total_bytes=1024,
            used_bytes=0,
            free_bytes=1024,
        ),
    ]
    assert cohabit == {("node-a", 0, None): 6 * GIB}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "a measurement needs a `devices:` list"),
        ({"devices": [{"gpu_index": 0}]}, "devices[1]: needs `node:` (a name)"),
        (
            {"devices": [{"node": "a", "gpu_index": -1, "total": 1, "used": 0, "free": 1}]},
            "devices[1].gpu_index: -1 is not a device index",
        ),
        (
            {"devices": [{"node": "a", "total": "8 GiB", "used": "lots", "free": 1}]},
            "devices[1].used: cannot read 'lots' as a size (examples: 16GiB, 15360MiB, 20GB)",
        ),
        (
            {"devices": [{"node": "a", "total": 1, "used": 0}]},
            "devices[1].free: expected a size such as 16GiB, got None",
        ),
    ],
)
def test_a_bad_recorded_measurement_names_the_entry_and_field(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageFileError) as caught:
        usage_from_json(data)
    assert str(caught.value) == message
