"""One kubelet device plugin per GPU budget: resource `cohabit.dev/vram-gb-gpu-<i>`, one
interchangeable device ID per GiB, and an `Allocate` that pins the container to its GPU.

Used by the node agent's device-plugin backend. The kubelet serves `Registration` on
kubelet.sock; each plugin serves `DevicePlugin` on its own socket in the same directory, and
must serve before it registers. A kubelet restart deletes every socket there: the agent sees
ours gone and starts again (`DevicePluginServer.lost()`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc

from cohabit.hardware.model import Vendor
from cohabit.kube.deviceplugin import api_pb2 as _api_pb2
from cohabit.kube.deviceplugin import api_pb2_grpc as _api_pb2_grpc
from cohabit.kube.errors import AgentError

KUBELET_SOCKET = "kubelet.sock"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
API_VERSION = "v1beta1"
HEALTHY = "Healthy"
REGISTER_TIMEOUT_S = 5.0
# The generated stubs carry no types (protobuf builds the message classes at import).
api_pb2: Any = _api_pb2
api_pb2_grpc: Any = _api_pb2_grpc


class Allocation(StrEnum):
    """How `Allocate` hands the container its GPU.

    CDI: a CDI device name per GPU (`nvidia.com/gpu=<uuid>` from `nvidia-ctk cdi generate`,
    whose default names are the index and the UUID; `amd.com/gpu=<index>` from
    `amd-ctk cdi generate`). The kubelet takes the union of every resource's CDI devices
    (pkg/kubelet/cm/devicemanager/pod_devices.go, `getCDIDeviceInfo`), so a pod holding the
    budgets of several GPUs gets all of them. Needs CDI on in the container runtime.
    ENV: NVIDIA_VISIBLE_DEVICES, read by the NVIDIA container runtime (NVIDIA only). The
    kubelet keeps the first value of a key and drops the others (`deviceRunContainerOptions`,
    same file), so a pod that holds several GPUs' budgets gets only one: single-GPU pods.
    Inside the container the engine's own variables number the devices from 0 (the pod
    builder sets them), so neither form passes a host index to CUDA.
    """

    CDI = "cdi"
    ENV = "env"


# Set beside either form, one key per GPU so nothing is dropped when the kubelet merges:
# what the pod was given, readable from inside it.
DEVICE_ENV = "COHABIT_VISIBLE_DEVICE_{index}"
CDI_KINDS: Mapping[Vendor, str] = {Vendor.NVIDIA: "nvidia.com/gpu", Vendor.AMD: "amd.com/gpu"}
RUNTIME_ENV = "NVIDIA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuBudget:
    """One GPU's advertised resource: `units` interchangeable device IDs (one per GiB of
    budget, or one for a GPU placed whole). `device` is what selects the GPU (its UUID
    when known, else its index)."""

    index: int
    resource: str
    units: int
    vendor: Vendor
    device: str
    whole: bool = False

    @property
    def device_ids(self) -> list[str]:
        """≤ 63 characters as the API requires: ``gpu0-gib-0007`` (``gpu0-whole-0000``)."""
        unit = "whole" if self.whole else "gib"
        return [f"gpu{self.index}-{unit}-{n:04d}" for n in range(self.units)]

    def container_allocation(self, allocation: Allocation) -> dict[str, Any]:
        """The `ContainerAllocateResponse` fields for one container holding this GPU."""
        envs = {DEVICE_ENV.format(index=self.index): self.device}
        if allocation is Allocation.ENV:
            if self.vendor is Vendor.NVIDIA:  # the NVIDIA container runtime selects by it
                envs[RUNTIME_ENV] = self.device
            return {"envs": envs}
        kind = CDI_KINDS.get(self.vendor)
        cdi = [] if kind is None else [{"name": f"{kind}={self.device}"}]
        return {"envs": envs, "cdi_devices": cdi}


class BudgetPlugin:
    """The DevicePlugin service for one budget (every RPC of the generated servicer)."""

    def __init__(
        self, budget: GpuBudget, stopping: threading.Event, allocation: Allocation
    ) -> None:
        self.budget = budget
        self.allocation = allocation
        self._stopping = stopping
        self._known = frozenset(budget.device_ids)

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        """The device list once; the budget never changes while the plugin lives, so the
        stream then stays open until the plugin stops or the kubelet hangs up."""
        yield api_pb2.ListAndWatchResponse(
            devices=[api_pb2.Device(ID=i, health=HEALTHY) for i in self.budget.device_ids]
        )
        while context.is_active() and not self._stopping.wait(0.5):
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        """The IDs are interchangeable GiB: any `allocation_size` of the available ones."""
        responses = []
        for container in request.container_requests:
            chosen = list(container.must_include_deviceIDs)
            for device in container.available_deviceIDs:
                if len(chosen) >= container.allocation_size:
                    break
                if device not in chosen:
                    chosen.append(device)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        """Give each container this GPU (see `Allocation`)."""
        responses = []
        for container in request.container_requests:
            unknown = [i for i in container.devices_ids if i not in self._known]
            if unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.budget.resource}: unknown device IDs {unknown[:3]}",
                )
            fields = self.budget.container_allocation(self.allocation)
            cdi = [api_pb2.CDIDevice(name=d["name"]) for d in fields.get("cdi_devices", ())]
            responses.append(
                api_pb2.ContainerAllocateResponse(envs=fields["envs"], cdi_devices=cdi)
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class DevicePluginServer:
    """Serves one `BudgetPlugin` on a unix socket and registers it with the kubelet."""

    def __init__(
        self,
        budget: GpuBudget,
        directory: Path = DEVICE_PLUGIN_DIR,
        allocation: Allocation = Allocation.CDI,
    ) -> None:
        self.budget = budget
        self.directory = directory
        self.allocation = allocation
        kind = "gpu" if budget.whole else "vram-gpu"
        self.socket_name = f"cohabit-{kind}-{budget.index}.sock"
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / self.socket_name

    def start(self) -> None:
        """Serve, then register (the order the kubelet requires)."""
        self.stop()
        self._stopping = threading.Event()
        self.socket_path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            BudgetPlugin(self.budget, self._stopping, self.allocation), server
        )
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        self._register()

    def _register(self) -> None:
        kubelet = f"unix://{self.directory / KUBELET_SOCKET}"
        with grpc.insecure_channel(kubelet) as channel:
            try:
                api_pb2_grpc.RegistrationStub(channel).Register(
                    api_pb2.RegisterRequest(
                        version=API_VERSION,
                        endpoint=self.socket_name,
                        resource_name=self.budget.resource,
                        options=api_pb2.DevicePluginOptions(
                            get_preferred_allocation_available=True
                        ),
                    ),
                    timeout=REGISTER_TIMEOUT_S,
                )
            except grpc.RpcError as error:
                self.stop()
                raise AgentError(
                    f"kubelet refused {self.budget.resource} at {kubelet}: "
                    f"{error.code().name} {error.details()}"
                ) from None

    def lost(self) -> bool:
        """True when our socket is gone: the kubelet restarted and cleared the directory."""
        return self._server is None or not self.socket_path.exists()

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(timeout=5.0)
            self._server = None
