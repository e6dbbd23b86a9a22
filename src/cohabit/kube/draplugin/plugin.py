"""The kubelet plugin of the DRA driver `gpu.cohabit.dev`: it serves the kubelet's `DRAPlugin`
API on dra.sock (prepare and unprepare the node's ResourceClaims, as CDI specs) and
`Registration` on the -reg.sock the kubelet's plugin watcher looks for. `kube/dra.py`
publishes the devices that the scheduler allocates and this prepares; `prepare.py` decides
what preparing one claim means.

Paths and names are those of k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go
(tag v0.37.0-alpha.2): the registration socket `<driver>-reg.sock` in
/var/lib/kubelet/plugins_registry, the DRA socket `dra.sock` in
/var/lib/kubelet/plugins/<driver>, served first so it is ready when the kubelet registers it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from cohabit.hardware.model import Node
from cohabit.kube import dra
from cohabit.kube.draplugin import dra_pb2 as _dra_pb2
from cohabit.kube.draplugin import dra_pb2_grpc as _dra_pb2_grpc
from cohabit.kube.draplugin import registration_pb2 as _registration_pb2
from cohabit.kube.draplugin import registration_pb2_grpc as _registration_pb2_grpc
from cohabit.kube.draplugin.prepare import (
    NodeDevice,
    PreparedClaim,
    Unpreparable,
    node_devices,
    prepare_claim,
)
from cohabit.kube.errors import KubeError

# Defaults of draplugin.go (`KubeletPluginsDir`, `KubeletRegistryDir`) and of the CDI
# library's dynamic spec directory (container-device-interface pkg/cdi/spec-dirs.go
# `DefaultDynamicDir`, tag v1.1.0), where container runtimes look for specs written at run time.
PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
CDI_DIR = Path("/var/run/cdi")
DRA_SOCKET = "dra.sock"
# PluginInfo.type for DRA (kubelet pkg/apis/pluginregistration/v1/constants.go `DRAPlugin`)
# and the service we implement, "<gRPC package>.<service>" as the kubelet's
# DRAPluginManager.RegisterPlugin reads supported_versions (pkg/apis/dra/v1/types.go
# `DRAPluginService`), both at kubelet tag v0.37.0-beta.0.
PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"
# The generated stubs carry no types (protobuf builds the message classes at import).
dra_pb2: Any = _dra_pb2
dra_pb2_grpc: Any = _dra_pb2_grpc
registration_pb2: Any = _registration_pb2
registration_pb2_grpc: Any = _registration_pb2_grpc

ReadClaim = Callable[[str, str], Mapping[str, Any] | None]
"""(namespace, name) -> the ResourceClaim as the API server returns it, None when absent;
raises a `KubeError` (e.g. `ClusterError`) when the API server cannot say."""

log = logging.getLogger(__name__)


def cdi_spec_path(cdi_dir: Path, claim_uid: str) -> Path:
    """One spec file per claim: gpu.cohabit.dev-<claim uid>.json."""
    return cdi_dir / f"{dra.DRIVER}-{claim_uid}.json"


class ClaimPreparer:
    """The DRAPlugin service (every RPC of the generated servicer). A claim that fails is
    answered in its own `error`, never as a failed call, so the others in the call stand."""

    def __init__(
        self,
        node_name: str,
        devices: Mapping[str, NodeDevice],
        read_claim: ReadClaim,
        cdi_dir: Path,
    ) -> None:
        self.node_name = node_name
        self.devices = devices
        self.read_claim = read_claim
        self.cdi_dir = cdi_dir

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = {claim.uid: self._prepare(claim) for claim in request.claims}
        return dra_pb2.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802
        answers = {claim.uid: self._unprepare(claim) for claim in request.claims}
        return dra_pb2.NodeUnprepareResourcesResponse(claims=answers)

    def _prepare(self, claim: Any) -> Any:
        try:
            outcome = prepare_claim(
                self.read_claim(claim.namespace, claim.name),
                namespace=claim.namespace,
                name=claim.name,
                uid=claim.uid,
                node_name=self.node_name,
                devices=self.devices,
            )
            if isinstance(outcome, Unpreparable):
                return self._refuse(claim, outcome.reason)
            self._write_spec(outcome)
        except (KubeError, OSError) as error:
            return self._refuse(claim, f"ResourceClaim {claim.namespace}/{claim.name}: {error}")
        return dra_pb2.NodePrepareResourceResponse(devices=_devices(outcome))

    def _refuse(self, claim: Any, reason: str) -> Any:
        log.warning("not preparing claim %s: %s", claim.uid, reason)
        return dra_pb2.NodePrepareResourceResponse(error=reason)

    def _write_spec(self, prepared: PreparedClaim) -> None:
        """Whole or not at all: the runtime's CDI cache reads the directory as it changes,
        and takes only *.json and *.yaml, so the file is written aside and renamed in."""
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        path = cdi_spec_path(self.cdi_dir, prepared.uid)
        partial = path.with_name(f".{path.name}.tmp")
        partial.write_text(json.dumps(prepared.cdi_spec(), indent=2) + "\n")
        os.replace(partial, path)

    def _unprepare(self, claim: Any) -> Any:
        """Remove the claim's spec; one already gone is unprepared (the kubelet retries)."""
        try:
            cdi_spec_path(self.cdi_dir, claim.uid).unlink(missing_ok=True)
        except OSError as error:
            return dra_pb2.NodeUnprepareResourceResponse(error=f"claim {claim.uid}: {error}")
        return dra_pb2.NodeUnprepareResourceResponse()


def _devices(prepared: PreparedClaim) -> list[Any]:
    return [
        dra_pb2.Device(
            request_names=[device.request],
            pool_name=device.pool,
            device_name=device.device.name,
            cdi_device_ids=[prepared.cdi_id(device)],
            share_id=device.share_id,  # None leaves the optional field unset
        )
        for device in prepared.devices
    ]


class PluginRegistration:
    """The Registration service the kubelet's plugin watcher calls: what we are, then whether
    it took us (`registered` is set once it did; `error` keeps what it said when not)."""

    def __init__(self, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error: str | None = None

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=dra.DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=[DRA_SERVICE],
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
        if request.plugin_registered:
            self.error = None
            self.registered.set()
        else:
            self.error = request.error or "the kubelet did not register the plugin"
            self.registered.clear()
            log.warning("kubelet did not register %s: %s", dra.DRIVER, self.error)
        return registration_pb2.RegistrationStatusResponse()


class DraPluginServer:
    """Serves the DRA plugin for `node` on its two sockets (`start`, `stop`); `registration`
    says whether the kubelet has registered it."""

    def __init__(
        self,
        node: Node,
        read_claim: ReadClaim,
        *,
        plugins_dir: Path = PLUGINS_DIR,
        registry_dir: Path = REGISTRY_DIR,
        cdi_dir: Path = CDI_DIR,
    ) -> None:
        self.node = node
        self.read_claim = read_claim
        self.plugins_dir = plugins_dir
        self.registry_dir = registry_dir
        self.cdi_dir = cdi_dir
        self.registration = PluginRegistration(self.dra_socket)
        self._servers: list[grpc.Server] = []

    @property
    def dra_socket(self) -> Path:
        return self.plugins_dir / dra.DRIVER / DRA_SOCKET

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{dra.DRIVER}-reg.sock"

    def start(self) -> None:
        """Serve DRAPlugin, then Registration: the kubelet dials dra.sock once registered."""
        self.stop()
        self.registration = PluginRegistration(self.dra_socket)
        preparer = ClaimPreparer(
            self.node.name, node_devices(self.node), self.read_claim, self.cdi_dir
        )
        self._servers.append(
            _serve(self.dra_socket, dra_pb2_grpc.add_DRAPluginServicer_to_server, preparer)
        )
        self._servers.append(
            _serve(
                self.registration_socket,
                registration_pb2_grpc.add_RegistrationServicer_to_server,
                self.registration,
            )
        )

    def stop(self) -> None:
        """Stop serving and remove both sockets: the plugin watcher deregisters us when the
        -reg.sock goes."""
        for server in reversed(self._servers):
            server.stop(grace=1.0).wait(timeout=5.0)
        self._servers = []
        self.registration_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)


def _serve(socket: Path, add: Callable[[Any, grpc.Server], None], servicer: Any) -> grpc.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)  # a previous run's, or the server cannot bind
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server
