"""One kubelet device plugin per GPU budget: resource `cohabit.dev/vram-gb-gpu-<i>`, one
interchangeable device ID per GiB, and an `Allocate` that pins the container to its GPU.

Used by the node agent's device-plugin backend. The kubelet serves `Registration` on
kubelet.sock; each plugin serves `DevicePlugin` on its own socket in the same directory, and
must serve before it registers. A kubelet restart deletes every socket there: the agent sees
ours gone and starts again (`DevicePluginServer.lost()`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cohabit.hardware.model import Vendor
from cohabit.kube.deviceplugin import api_pb2 as _api_pb2
from cohabit.kube.deviceplugin import api_pb2_grpc as _api_pb2_grpc
from cohabit.kube.errors import AgentError
from cohabit.kube.resources import VISIBLE_DEVICES

KUBELET_SOCKET = "kubelet.sock"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
API_VERSION = "v1beta1"
HEALTHY = "Healthy"
REGISTER_TIMEOUT_S = 5.0
# The generated stubs carry no types (protobuf builds the message classes at import).
api_pb2: Any = _api_pb2
api_pb2_grpc: Any = _api_pb2_grpc


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuBudget:
    """One GPU's advertised budget. `device` is what the runtime's visible-devices variable
    takes (the GPU UUID when known, else its index)."""

    index: int
    resource: str
    gib: int
    vendor: Vendor
    device: str

    @property
    def device_ids(self) -> list[str]:
        """One ID per GiB, ≤ 63 characters as the API requires: ``gpu0-gib-0007``."""
        return [f"gpu{self.index}-gib-{unit:04d}" for unit in range(self.gib)]

    def envs(self) -> dict[str, str]:
        return dict.fromkeys(VISIBLE_DEVICES.get(self.vendor, ()), self.device)


class BudgetPlugin:
    """The DevicePlugin service for one budget (every RPC of the generated servicer)."""

    def __init__(self, budget: GpuBudget, stopping: threading.Event) -> None:
        self.budget = budget
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
        """Pin each container to this GPU through the vendor's visible-devices env."""
        responses = []
        for container in request.container_requests:
            unknown = [i for i in container.devices_ids if i not in self._known]
            if unknown:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.budget.resource}: unknown device IDs {unknown[:3]}",
                )
            responses.append(api_pb2.ContainerAllocateResponse(envs=self.budget.envs()))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return api_pb2.PreStartContainerResponse()


class DevicePluginServer:
    """Serves one `BudgetPlugin` on a unix socket and registers it with the kubelet."""

    def __init__(self, budget: GpuBudget, directory: Path = DEVICE_PLUGIN_DIR) -> None:
        self.budget = budget
        self.directory = directory
        self.socket_name = f"cohabit-vram-gpu-{budget.index}.sock"
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
            BudgetPlugin(self.budget, self._stopping), server
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
