"""`cohabit serve --backend kubernetes`: ModelDeployments as the control plane's engine runtime
and the cluster as its hardware. `cli/serve.py` wires both into `service.app.create_app`.

The control plane plans against the cluster view and reserves in its own ledger (so a NoFit is
immediate and structured); `KubernetesRuntime.start` then creates a ModelDeployment pinned to
that node, those devices and that budget, and the operator honours the pin (or records why it
no longer fits). `ClusterFleetSource` is the fleet the reconciler refreshes: nodes less what
pods other than our own ModelDeployments' hold, so nothing is counted twice.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import urllib3

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.errors import EstimateError
from cohabit.hardware.model import Fleet, Topology
from cohabit.hardware.usage import DeviceUsage
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort, api_client, config
from cohabit.kube.dra import DRA_BACKEND, PLACEMENT_BACKEND_ENV
from cohabit.kube.errors import ClusterError, InvalidSpec
from cohabit.kube.fleetview import (
    fleet_less_held,
    node_measurements,
    topology_of,
    view_for,
)
from cohabit.runtime.engines import llamacpp
from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    EngineStatus,
    LaunchRequest,
    RuntimeErrorCode,
)
from cohabit.units import gib_ceil

LABEL_DEPLOYMENT_ID = "cohabit.dev/deployment-id"  # on ModelDeployments the control plane made
LABEL_CREATED_BY = "app.kubernetes.io/created-by"
ANNOTATION_RELAUNCHED = "cohabit.dev/relaunched-at"  # set by each relaunch (`_relaunch`)
CREATED_BY = "cohabit-api"
NAME_PREFIX = "cohabit-"
# A pod is named "<name>-engine": 63 characters at most in all.
_NAME_MAX = 63 - len("-engine")
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
# huggingface_hub's cache keeps repo "org/name" under models--org--name/snapshots/<rev>: a pod
# cannot see our cache, so vLLM gets the repo id and downloads it itself.
_HUB_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")
_ENDED = frozenset({crd.Phase.FAILED, crd.Phase.ERROR, crd.Phase.STOPPED, crd.Phase.PAUSED})
_RUNTIME_CODES = frozenset(code.value for code in RuntimeErrorCode)

log = logging.getLogger(__name__)


class RuntimePort(Protocol):
    """The API calls this module makes; `cluster.KubernetesPort` is the real one."""

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def list_pods(self, namespace: str | None) -> list[dict[str, Any]]: ...

    def list_claims(self) -> list[dict[str, Any]]: ...

    def list_model_deployments(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_model_deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_model_deployment(self, body: Mapping[str, Any]) -> None: ...

    def replace_model_deployment_spec(
        self, namespace: str, name: str, spec: Mapping[str, Any]
    ) -> None: ...

    def annotate_model_deployment(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None: ...

    def delete_model_deployment(self, namespace: str, name: str) -> None: ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def pod_log(self, namespace: str, name: str, *, tail: int) -> list[str] | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendSettings:
    """Where ModelDeployments go and how the cluster is read: the same COHABIT_MODE,
    COHABIT_NAMESPACE, COHABIT_FRACTIONAL and COHABIT_PLACEMENT_BACKEND the chart gives
    the operator.

    `pods_namespace`: whose pods count against budgets — all namespaces on a standalone
    cluster, only ours on a managed one (where we may not list others)."""

    namespace: str
    topology: Topology = Topology.STANDALONE_CLUSTER
    fractional: bool = True
    node_selector: str = ""  # the chart's placement.nodeSelector: the nodes we may use
    dra: bool = False  # the chart's placement.backend: dra (nodes publish ResourceSlices)

    @property
    def pods_namespace(self) -> str | None:
        return self.namespace if self.topology is Topology.MANAGED_CLUSTER else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BackendSettings:
        env = os.environ if env is None else env
        return cls(
            namespace=env.get("COHABIT_NAMESPACE") or "default",
            topology=topology_of(env.get("COHABIT_MODE", "standalone")),
            fractional=env.get("COHABIT_FRACTIONAL", "true").lower() == "true",
            node_selector=env.get("COHABIT_NODE_SELECTOR", ""),
            dra=env.get(PLACEMENT_BACKEND_ENV) == DRA_BACKEND,
        )


def connect(*, host: str | None = None, node_selector: str = "") -> KubernetesPort:
    """The API server from the in-cluster service account or the kubeconfig (`host`: a test
    server), reading only the nodes `node_selector` names. Raises ClusterError naming what
    is missing."""
    try:
        return KubernetesPort(api_client(host=host), node_selector=node_selector)
    except config.ConfigException as err:
        raise ClusterError(
            f"no Kubernetes cluster configured ({err}); run in a pod or set KUBECONFIG"
        ) from None


def md_name(deployment_id: str) -> str:
    """The ModelDeployment (and Service) name of a deployment: a DNS-1035 label."""
    cleaned = _NOT_NAME.sub("-", deployment_id.lower()).strip("-")
    return (NAME_PREFIX + cleaned)[:_NAME_MAX].rstrip("-")


def model_ref(request: LaunchRequest, engine: str) -> str:
    """What the pod loads: the Hub repo id for a vLLM model we found in the Hub cache, else
    the path as registered (it must be mounted at that path in the engine image)."""
    found = _HUB_SNAPSHOT.search(request.model_path)
    if engine == "vllm" and found is not None:
        return f"{found['org']}/{found['name']}"
    return request.model_path


def engine_of(request: LaunchRequest) -> str:
    engine = request.engine or "auto"
    if engine == "auto":
        return "llamacpp" if request.model_path.endswith(".gguf") else "vllm"
    if engine not in ("vllm", "llamacpp"):
        raise InvalidSpec(f"engine {engine!r} does not run on Kubernetes (use vllm or llamacpp)")
    return engine


def model_deployment(request: LaunchRequest, *, namespace: str) -> dict[str, Any]:
    """The ModelDeployment for a launch: the budget per device as `vram` (whole GiB, the unit
    budgets are published in), the placement the control plane reserved as the pin, and the
    settings and estimate admission sized (so the pod's engine gets the local flags)."""
    engine = engine_of(request)
    placement = request.placement
    spec = crd.ModelDeploymentSpec(
        model=model_ref(request, engine),
        engine=engine,  # type: ignore[arg-type]  # checked by engine_of
        served_model_name=request.served_model_name,
        config=crd.EngineConfig(extra_args=request.extra_args),
        sizing=carried_sizing(request, engine),
        tensor_parallel_size=placement.request.tensor_parallel,
        vram=f"{gib_ceil(placement.request.vram_bytes)}GiB",
        placement=crd.PinnedPlacement(
            node=placement.node,
            slots=tuple(
                crd.PinnedSlot(gpu_index=a.slot.gpu_index, partition_index=a.slot.partition_index)
                for a in placement.allocations
            ),
        ),
    )
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {
            "name": md_name(request.deployment_id),
            "namespace": namespace,
            "labels": {
                LABEL_DEPLOYMENT_ID: request.deployment_id,
                LABEL_CREATED_BY: CREATED_BY,
            },
        },
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }


def carried_sizing(request: LaunchRequest, engine: str) -> crd.Sizing:
    """What admission sized, for the operator to launch the pod's engine with. vLLM: the
    settings and the estimate. llama.cpp fits its layers and context to the budget from
    the GGUF's metadata, which the operator cannot read (the file is in the pod's volume):
    the fit is made here, with the launcher's own `fitted`, and carried as settings."""
    if engine != "llamacpp":
        estimate = None if request.estimate is None else request.estimate.to_dict()
        return crd.Sizing(settings=request.settings.to_dict(), estimate=estimate)
    try:
        shape = load_shape(Path(request.model_path))
    except EstimateError:
        shape = None  # llama.cpp then reads it in the pod; every layer offloaded
    layers, ctx = llamacpp.fitted(request, shape)
    settings = replace(
        request.settings,
        n_gpu_layers=request.settings.n_gpu_layers if layers == llamacpp.ALL_LAYERS else layers,
        max_model_len=ctx,
    )
    return crd.Sizing(settings=settings.to_dict())


def engine_status(
    md: Mapping[str, Any] | None,
    *,
    key: str,
    now: datetime,
    startup_timeout_s: float | None = None,
) -> EngineStatus:
    """A ModelDeployment's status as the reconciler's `EngineStatus`: READY once its `Ready`
    condition is true; FAILED with the operator's error code (one the runtime does not know,
    NoFitError or InvalidSpec, becomes RUNTIME_ERROR with the code in the message)."""
    if md is None:
        return EngineStatus(
            state=EngineState.FAILED,
            error_code=RuntimeErrorCode.CONTAINER_EXITED,
            error_message=f"ModelDeployment {key} was deleted outside cohabit",
            error_at=now,
        )
    status = crd.parse_status(md.get("status"))
    ready = any(c.type == crd.READY and c.status == "True" for c in status.conditions)
    if ready or status.phase is crd.Phase.DEPLOYED:
        return EngineStatus(state=EngineState.READY)
    if status.phase in (crd.Phase.STOPPED, crd.Phase.PAUSED):
        done = "paused" if status.phase is crd.Phase.PAUSED else "stopped"
        return EngineStatus(
            state=EngineState.STOPPED,
            error_message=f"ModelDeployment {key} was {done} outside cohabit",
        )
    if status.phase in _ENDED and not _stale(md, status):
        text = status.last_error_code
        code = RuntimeErrorCode(text) if text in _RUNTIME_CODES else RuntimeErrorCode.RUNTIME_ERROR
        message = status.last_error_message or f"ModelDeployment {key} {status.phase.value}"
        if text and text != code.value:
            message = f"{text}: {message}"
        return EngineStatus(
            state=EngineState.FAILED,
            error_code=code,
            error_message=message,
            error_at=_parse_time(status.last_error_at) or now,
        )
    created = _parse_time((md.get("metadata") or {}).get("creationTimestamp"))
    if startup_timeout_s is not None and created is not None:
        waited_s = (now - created).total_seconds()
        if waited_s > startup_timeout_s:
            return EngineStatus(
                state=EngineState.FAILED,
                error_code=RuntimeErrorCode.STARTUP_TIMEOUT,
                error_message=(
                    f"ModelDeployment {key} not ready after {startup_timeout_s:.0f} s "
                    f"(phase {status.phase.value})"
                ),
                error_at=now,
            )
    return EngineStatus(state=EngineState.STARTING)


def _stale(md: Mapping[str, Any], status: crd.ModelDeploymentStatus) -> bool:
    """A status the operator wrote for an older spec (we relaunched with a new one)."""
    generation = (md.get("metadata") or {}).get("generation")
    observed = status.observed_generation
    return observed is not None and isinstance(generation, int) and observed < generation


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class KubernetesRuntime:
    """`EngineRuntime` over ModelDeployments in one namespace. The handle names the
    ModelDeployment through the deployment id; `base_url` is its Service's cluster URL."""

    def __init__(
        self,
        port: RuntimePort,
        *,
        namespace: str,
        startup_timeout_s: float | None = None,
    ) -> None:
        self.port = port
        self.namespace = namespace
        self.startup_timeout_s = startup_timeout_s

    def _key(self, deployment_id: str) -> str:
        return f"{self.namespace}/{md_name(deployment_id)}"

    def start(self, request: LaunchRequest) -> EngineHandle:
        body = model_deployment(request, namespace=self.namespace)
        name = body["metadata"]["name"]
        existing = self.port.get_model_deployment(self.namespace, name)
        if existing is None:
            self.port.create_model_deployment(body)
        elif (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise ClusterError(f"ModelDeployment {self.namespace}/{name} is still being deleted")
        else:
            self._relaunch(name, body["spec"])
        port = int(body["spec"]["servicePort"])
        return EngineHandle(
            deployment_id=request.deployment_id,
            port=port,
            base_url=f"http://{name}.{self.namespace}.svc:{port}",
        )

    def _relaunch(self, name: str, spec: Mapping[str, Any]) -> None:
        """Start an existing ModelDeployment again (after a restart, or its pod was lost):
        its old outcome cleared, its spec made exactly ours, and the operator told. A delete
        and create would have to wait for the old pod to go (foreground deletion).

        The order matters. The operator ignores status changes, and the spec is usually the
        same as before (same placement and sizing), so no new generation and no event: the
        last write, an annotation, is the change it acts on, and by then the status it reads
        no longer says the pod was lost for good."""
        self.port.patch_status(self.namespace, name, crd.ModelDeploymentStatus().to_wire())
        self.port.replace_model_deployment_spec(self.namespace, name, spec)
        self.port.annotate_model_deployment(
            self.namespace, name, {ANNOTATION_RELAUNCHED: crd.timestamp(precise=True)}
        )

    def status(self, handle: EngineHandle) -> EngineStatus:
        md = self.port.get_model_deployment(self.namespace, md_name(handle.deployment_id))
        return engine_status(
            md,
            key=self._key(handle.deployment_id),
            now=datetime.now(UTC),
            startup_timeout_s=self.startup_timeout_s,
        )

    def stop(self, handle: EngineHandle) -> None:
        """Delete the ModelDeployment; its pod and Service go with it (owner references). In
        the foreground: until its pod is gone it is still listed, so `ClusterFleetSource`
        does not count the terminating pod as someone else's while the ledger has already
        given its budget away."""
        self.port.delete_model_deployment(self.namespace, md_name(handle.deployment_id))

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        """The deployment's handle (its id names the Service that routes to it) while its
        ModelDeployment runs and is ours."""
        md = self.port.get_model_deployment(self.namespace, md_name(handle.deployment_id))
        if md is None:
            return None
        labels = (md.get("metadata") or {}).get("labels") or {}
        spec = md.get("spec") or {}
        phase = crd.parse_status(md.get("status")).phase
        ours = (
            labels.get(LABEL_DEPLOYMENT_ID) == handle.deployment_id
            and spec.get("state", "running") == "running"
            and phase not in _ENDED
        )
        return EngineHandle(deployment_id=handle.deployment_id) if ours else None

    def engines(self) -> list[EngineHandle]:
        """A handle for each ModelDeployment of this namespace that the control plane made."""
        found: list[EngineHandle] = []
        for md in self.port.list_model_deployments(self.namespace):
            labels = (md.get("metadata") or {}).get("labels") or {}
            deployment_id = labels.get(LABEL_DEPLOYMENT_ID)
            if deployment_id:
                found.append(EngineHandle(deployment_id=str(deployment_id)))
        return found

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        """The engine container's log tail; empty while there is no pod."""
        name = md_name(handle.deployment_id)
        md = self.port.get_model_deployment(self.namespace, name) or {}
        pod = crd.parse_status(md.get("status")).pod_name or f"{name}-engine"
        return self.port.pod_log(self.namespace, pod, tail=tail) or []

    def discard(self, deployment_id: str) -> None:
        """Nothing to delete: logs live with the pod, which `stop` deleted."""
        del deployment_id


@dataclass(frozen=True, slots=True, kw_only=True)
class KubernetesBackend:
    """What `cohabit serve --backend kubernetes` hands `service.app.create_app`: the
    runtime, the fleet it refreshes and the meter's measure, all over one port."""

    runtime: KubernetesRuntime
    fleet_source: ClusterFleetSource
    measure: ClusterMeasure


def kubernetes_backend(
    port: RuntimePort, settings: BackendSettings, *, startup_timeout_s: float | None = None
) -> KubernetesBackend:
    return KubernetesBackend(
        runtime=KubernetesRuntime(
            port, namespace=settings.namespace, startup_timeout_s=startup_timeout_s
        ),
        fleet_source=ClusterFleetSource(port, settings),
        measure=ClusterMeasure(port),
    )


class ClusterFleetSource:
    """The control plane's fleet, read from the cluster each time it is called: nodes (labels
    and allocatable) less what every pod but our own ModelDeployments' holds."""

    def __init__(self, port: RuntimePort, settings: BackendSettings) -> None:
        self.port = port
        self.settings = settings

    def __call__(self) -> Fleet:
        settings = self.settings
        try:
            nodes = self.port.list_nodes()
            pods = self.port.list_pods(settings.pods_namespace)
            claims = self.port.list_claims() if settings.dra else []
            ours = {
                f"{settings.namespace}/{md['metadata']['name']}"
                for md in self.port.list_model_deployments(settings.namespace)
                if LABEL_DEPLOYMENT_ID in (md["metadata"].get("labels") or {})
            }
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ClusterError(f"cannot reach the Kubernetes API server: {err}") from None
        view = view_for(nodes, pods, settings, claims)
        return fleet_less_held(view.state, keep=ours)


class ClusterMeasure:
    """The server meter's `measure` on a cluster: what the node agents last reported on each
    node (fresh reports only). A node whose report goes stale or unreadable is logged once,
    and once more when its reports are used again."""

    def __init__(
        self, port: RuntimePort, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.port = port
        self.clock = clock
        self._ignored: dict[str, str] = {}

    def __call__(self, fleet: Fleet) -> list[DeviceUsage]:
        del fleet  # the cluster's nodes are read afresh: the agents report on the Node objects
        try:
            nodes = self.port.list_nodes()
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise ClusterError(f"cannot reach the Kubernetes API server: {err}") from None
        devices, problems = node_measurements(nodes, now=self.clock())
        for node, problem in problems.items():
            if node not in self._ignored:
                log.warning("node %s: memory report not used: %s", node, problem)
        for node in set(self._ignored) - set(problems):
            log.warning("node %s: memory report used again", node)
        self._ignored = problems
        return devices
