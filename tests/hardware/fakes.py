"""Fakes at the library boundary: a recorded snapshot replayed through an object shaped like
the `pynvml`, `amdsmi` or `sysctl` interface the adapters call. Snapshots are JSON files in
tests/fixtures/hardware named by machine; each value sits under the name of the call that
returned it, and ``{"error": "NVML_ERROR_…"}`` makes that call raise.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cohabit.hardware.host import HostMemory, parse_meminfo
from tests.conftest import FIXTURES

HARDWARE = FIXTURES / "hardware"

# pynvml's error codes (pynvml.py: NVML_ERROR_*), the ones snapshots use.
_NVML_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_UNKNOWN": 999,
}
_AMDSMI_CODES = {"AMDSMI_STATUS_NOT_SUPPORTED": 2, "AMDSMI_STATUS_INIT_ERROR": 34}


def load(name: str) -> dict[str, Any]:
    """A snapshot by file name (``nvml_t4x4.json``)."""
    data: dict[str, Any] = json.loads((HARDWARE / name).read_text(encoding="utf-8"))
    return data


def host_of(snapshot: dict[str, Any]) -> HostMemory | None:
    """The host memory recorded with a snapshot (its /proc/meminfo), if any."""
    text = snapshot.get("host", {}).get("/proc/meminfo")
    return None if text is None else parse_meminfo(text)


class NVMLError(Exception):
    """Like pynvml.NVMLError: `value` is the NVML return code; subclasses per code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {code: name for name, code in _NVML_CODES.items()}
        return names.get(self.value, f"NVML error {self.value}")


class FakeNvml:
    """Replays an `nvml_*.json` snapshot through pynvml's function names and return shapes.

    Device handles are ("gpu", i) and MIG handles ("mig", i, j); structs are namespaces with
    pynvml's field names (`total`, `free`, `used`, `memorySizeMB`, `usedGpuMemory` …).
    """

    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVMLError = NVMLError

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.calls: list[str] = []
        for name, code in _NVML_CODES.items():
            setattr(self, name, code)
            class_name = "NVMLError_" + "".join(
                part.capitalize() for part in name.removeprefix("NVML_ERROR_").split("_")
            )
            setattr(self, class_name, type(class_name, (NVMLError,), {}))

    def _answer(self, call: str, value: Any) -> Any:
        self.calls.append(call)
        if isinstance(value, dict) and set(value) == {"error"}:
            raise NVMLError(_NVML_CODES[value["error"]])
        return value

    def _device(self, handle: tuple[Any, ...]) -> dict[str, Any]:
        device: dict[str, Any] = self.snapshot["devices"][handle[1]]
        if handle[0] == "mig":
            mig: dict[str, Any] = device["mig_devices"][handle[2]]
            return mig
        return device

    def _struct(self, call: str, handle: tuple[Any, ...]) -> Any:
        value = self._answer(call, self._device(handle)[call])
        return SimpleNamespace(**value)

    def nvmlInit(self) -> None:  # noqa: N802 — pynvml's names
        self._answer("nvmlInit", self.snapshot.get("nvmlInit"))

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return str(
            self._answer("nvmlSystemGetDriverVersion", self.snapshot["nvmlSystemGetDriverVersion"])
        )

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        return int(
            self._answer(
                "nvmlSystemGetCudaDriverVersion", self.snapshot["nvmlSystemGetCudaDriverVersion"]
            )
        )

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self._answer("nvmlDeviceGetCount", self.snapshot.get("devices", [])))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[Any, ...]:  # noqa: N802
        self.calls.append("nvmlDeviceGetHandleByIndex")
        return ("gpu", index)

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> str:  # noqa: N802
        return str(self._answer("nvmlDeviceGetName", self._device(handle)["nvmlDeviceGetName"]))

    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str:  # noqa: N802
        return str(self._answer("nvmlDeviceGetUUID", self._device(handle)["nvmlDeviceGetUUID"]))

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[Any, ...]) -> Any:  # noqa: N802
        return self._struct("nvmlDeviceGetMemoryInfo", handle)

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[Any, ...]) -> tuple[int, int]:  # noqa: N802
        major, minor = self._answer(
            "nvmlDeviceGetCudaComputeCapability",
            self._device(handle)["nvmlDeviceGetCudaComputeCapability"],
        )
        return int(major), int(minor)

    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:  # noqa: N802
        return list(
            self._answer("nvmlDeviceGetMigMode", self._device(handle)["nvmlDeviceGetMigMode"])
        )

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:  # noqa: N802
        return int(
            self._answer(
                "nvmlDeviceGetMaxMigDeviceCount",
                self._device(handle)["nvmlDeviceGetMaxMigDeviceCount"],
            )
        )

    def nvmlDeviceGetMigDeviceHandleByIndex(  # noqa: N802
        self, handle: tuple[Any, ...], index: int
    ) -> tuple[Any, ...]:
        migs = self._device(handle).get("mig_devices", [])
        entry = migs[index] if index < len(migs) else {"error": "NVML_ERROR_NOT_FOUND"}
        if isinstance(entry, dict) and set(entry) == {"error"}:
            self._answer("nvmlDeviceGetMigDeviceHandleByIndex", entry)
        self.calls.append("nvmlDeviceGetMigDeviceHandleByIndex")
        return ("mig", handle[1], index)

    def nvmlDeviceGetAttributes(self, handle: tuple[Any, ...]) -> Any:  # noqa: N802
        return self._struct("nvmlDeviceGetAttributes", handle)

    def nvmlDeviceGetPciInfo(self, handle: tuple[Any, ...]) -> Any:  # noqa: N802
        """`busId` as pynvml's ctypes struct returns it (bytes); a snapshot that did not
        record the call answers Not Supported."""
        device = self._device(handle)
        value = device.get("nvmlDeviceGetPciInfo", {"error": "NVML_ERROR_NOT_SUPPORTED"})
        info = dict(self._answer("nvmlDeviceGetPciInfo", value))
        info["busId"] = str(info["busId"]).encode()
        return SimpleNamespace(**info)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: tuple[Any, ...]) -> list[Any]:  # noqa: N802
        processes = self._answer(
            "nvmlDeviceGetComputeRunningProcesses",
            self._device(handle).get("nvmlDeviceGetComputeRunningProcesses", []),
        )
        return [SimpleNamespace(**process) for process in processes]


class AmdSmiException(Exception):
    """amdsmi's base error."""


class AmdSmiLibraryException(AmdSmiException):
    """Like amdsmi.AmdSmiLibraryException: `err_code` is the amdsmi status."""

    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code


class FakeAmdSmi:
    """Replays an `amdsmi_*.json` snapshot through amdsmi's function names and dict keys.

    Processor handles are the indices of the snapshot's `processors`.
    """

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot
        self.calls: list[str] = []

    def _answer(self, call: str, value: Any) -> Any:
        self.calls.append(call)
        if isinstance(value, dict) and set(value) == {"error"}:
            raise AmdSmiLibraryException(_AMDSMI_CODES[value["error"]])
        return value

    def _processor(self, call: str, handle: int) -> Any:
        return self._answer(call, self.snapshot["processors"][handle][call])

    def amdsmi_init(self) -> None:
        self._answer("amdsmi_init", self.snapshot.get("amdsmi_init"))

    def amdsmi_shut_down(self) -> None:
        self.calls.append("amdsmi_shut_down")

    def amdsmi_get_processor_handles(self) -> list[int]:
        return list(
            range(len(self._answer("amdsmi_get_processor_handles", self.snapshot["processors"])))
        )

    def amdsmi_get_rocm_version(self) -> tuple[bool, str]:
        ok, version = self._answer(
            "amdsmi_get_rocm_version", self.snapshot["amdsmi_get_rocm_version"]
        )
        return bool(ok), str(version)

    def amdsmi_get_gpu_asic_info(self, handle: int) -> dict[str, Any]:
        return dict(self._processor("amdsmi_get_gpu_asic_info", handle))

    def amdsmi_get_gpu_vram_info(self, handle: int) -> dict[str, Any]:
        return dict(self._processor("amdsmi_get_gpu_vram_info", handle))

    def amdsmi_get_gpu_vram_usage(self, handle: int) -> dict[str, Any]:
        return dict(self._processor("amdsmi_get_gpu_vram_usage", handle))

    def amdsmi_get_gpu_device_uuid(self, handle: int) -> str:
        return str(self._processor("amdsmi_get_gpu_device_uuid", handle))

    def amdsmi_get_gpu_device_bdf(self, handle: int) -> str:
        return str(self._recorded("amdsmi_get_gpu_device_bdf", handle))

    def amdsmi_get_gpu_kfd_info(self, handle: int) -> dict[str, Any]:
        return dict(self._recorded("amdsmi_get_gpu_kfd_info", handle))

    def _recorded(self, call: str, handle: int) -> Any:
        """A call the snapshot may not have recorded: then it answers Not Supported."""
        processor = self.snapshot["processors"][handle]
        return self._answer(call, processor.get(call, {"error": "AMDSMI_STATUS_NOT_SUPPORTED"}))

    def amdsmi_get_gpu_compute_partition(self, handle: int) -> str:
        return str(self._processor("amdsmi_get_gpu_compute_partition", handle))

    def amdsmi_get_gpu_memory_partition(self, handle: int) -> str:
        return str(self._processor("amdsmi_get_gpu_memory_partition", handle))

    def amdsmi_get_gpu_driver_info(self, handle: int) -> dict[str, Any]:
        return dict(self._processor("amdsmi_get_gpu_driver_info", handle))


class FakeSysctl:
    """Replays a `sysctl_*.json` snapshot: `sysctl -n KEY` answers, and Metal's working set."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.values: dict[str, str] = snapshot["sysctl"]
        self.working_set: int | None = snapshot.get("metal", {}).get("recommendedMaxWorkingSetSize")

    def __call__(self, key: str) -> str | None:
        return self.values.get(key)

    def metal_working_set(self) -> int | None:
        return self.working_set


def nvml(name: str) -> FakeNvml:
    return FakeNvml(load(name))


def amdsmi(name: str) -> FakeAmdSmi:
    return FakeAmdSmi(load(name))


def sysctl(name: str) -> FakeSysctl:
    return FakeSysctl(load(name))


def fixture_path(name: str) -> Path:
    return HARDWARE / name
