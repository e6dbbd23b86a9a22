"""What the operator does for one ModelDeployment, behind a small `ClusterPort` so no
framework leaks in: read spec → plan against the cluster view → create the pod and service,
or record the NoFit on the status with no pod at all. `operator.py` (kopf) only calls these.

Every decision holds one lock, from the lists it plans on until its pod exists (and so
counts in the next one's lists): kopf works on several objects at once, and two plans made
against the same view would both take the same budget. Releasing gated pods holds it too.
What is done to one ModelDeployment (its decision, its status writes, a look at its pod) is
also serialized under that deployment's own lock (`keylocks`), taken first, so its status
writes keep their order while the status writes of others overlap. One operator replica.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from cohabit.estimate.errors import EstimateError
from cohabit.estimate.estimate import Estimate, estimate_model
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.classify import WHOLE_GPU
from cohabit.hardware.model import Topology, Vendor
from cohabit.kube import crd
from cohabit.kube.crd import ModelDeploymentSpec, ModelDeploymentStatus, Phase
from cohabit.kube.errors import AlreadyExists, ClusterError, InvalidSpec
from cohabit.kube.fleetview import (
    ANNOTATION_GENERATION,
    ANNOTATION_SHARING,
    ClusterView,
    node_measurements,
    pinned_state,
    view_for,
    with_unschedulable_reasons,
)
from cohabit.kube.keylocks import KeyedLocks
from cohabit.kube.podstatus import PodReport, pod_report
from cohabit.kube.resources import (
    DEFAULT_DOWNLOADER_IMAGE,
    DEFAULT_ENGINE_RESOURCES,
    DEFAULT_IMAGES,
    DEFAULT_RUN_AS_USER,
    LABEL_DEPLOYMENT,
    ServingTarget,
    claim_template,
    serving_pod,
    serving_service,
)
from cohabit.kube.startqueue import devices_of, must_wait, starting, to_release
from cohabit.kube.versions import newest
from cohabit.placement.decision import Placement
from cohabit.placement.errors import InvalidRequest
from cohabit.placement.planner import never_fits, plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import Measurement
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import GIB, gib_ceil

_LOCK = threading.RLock()  # every budget decision, and the start queue
_DEPLOYMENT_LOCKS = KeyedLocks()  # what is done to one ModelDeployment, by its key
_NOT_FOUND = 404
_AGAIN = "; it will be placed again"  # how a loss to be placed again is recorded


class ClusterPort(Protocol):
    """The API calls the operator makes; `cluster.KubernetesPort` is the real one."""

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        """The nodes cohabit may place on, possibly as a watch last delivered them; with
        `listed_since` (a `time.monotonic()`), from a list begun no earlier."""
        ...

    def list_pods(
        self,
        namespace: str | None,
        *,
        seen: str | None = None,
        listed_since: float | None = None,
    ) -> list[dict[str, Any]]:
        """The pods of `namespace` (None: all), including every write up to resourceVersion
        `seen` and every pod write made through this port; with `listed_since`, from a list
        begun no earlier."""
        ...

    def list_claims(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        """Every namespace's ResourceClaims (the DRA backend's); with `listed_since`, from a
        list begun no earlier."""
        ...

    def get_pod(
        self, namespace: str, name: str, *, seen: str | None = None
    ) -> dict[str, Any] | None: ...

    def assume(self, pod: dict[str, Any]) -> None:
        """Count `pod` in every pod list from now until `forget(pod)`: decided, and about
        to be created (the scheduler's assumed pods), so the next decision counts it."""
        ...

    def forget(self, pod: dict[str, Any]) -> None:
        """Stop counting an assumed pod: created (lists have it now) or refused."""
        ...

    def create(self, body: Mapping[str, Any]) -> None:
        """Create a Pod or ResourceClaimTemplate; AlreadyExists when one of that name is
        there."""
        ...

    def apply(self, body: Mapping[str, Any]) -> None:
        """Create a Service or bring it to this body."""
        ...

    def delete_pod(self, namespace: str, name: str) -> None: ...

    def delete_service(self, namespace: str, name: str) -> None: ...

    def open_gate(self, namespace: str, name: str) -> None:
        """Remove a pod's scheduling gates, so the scheduler places it."""
        ...

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def get_model_deployment(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_model_deployments(self, namespace: str | None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class OperatorSettings:
    """Install-time choices (Helm values → env, see `settings_from_env`).

    `pods_namespace`: where budget-holding pods are counted — None (all namespaces) on a
    standalone cluster, our own namespace on a managed one, where we may not list others.
    """

    topology: Topology
    fractional: bool = True
    pods_namespace: str | None = None
    inject_visible_devices: bool = False
    dra: bool = False  # nodes publish ResourceSlices; pods claim their devices
    images: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_IMAGES)
    downloader_image: str = DEFAULT_DOWNLOADER_IMAGE
    hard_limit_library: str | None = None
    retry_delay_s: float = 60.0
    memory_headroom_bytes: int = GIB  # kept free beside what the node agents measured
    watch_namespace: str | None = None  # whose ModelDeployments we serve (None: all)
    engine_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: DEFAULT_ENGINE_RESOURCES
    )
    run_as_user: int | None = DEFAULT_RUN_AS_USER


def measured(
    nodes: list[dict[str, Any]], settings: OperatorSettings, *, now: datetime
) -> Measurement | None:
    """The node agents' fresh memory reports as the planner's measurement (None: none)."""
    devices, _ignored = node_measurements(nodes, now=now)
    if not devices:
        return None
    cohabit = {device.key: device.cohabit_bytes or 0 for device in devices}
    return Measurement.of(devices, cohabit, headroom_bytes=settings.memory_headroom_bytes)


class Retry(StrEnum):
    NONE = "none"  # done, or waiting on the pod
    LATER = "later"  # may fit when budgets free up
    NEVER = "never"  # the spec or the hardware must change


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDeploymentRef:
    """One ModelDeployment as the API server gave it."""

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    seen: str | None = None  # the resourceVersion the decision's reads must include

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """The status to record and whether to try again. `only`: write just these status
    fields (a look at an existing pod must not clear the placement it does not know)."""

    status: ModelDeploymentStatus
    retry: Retry = Retry.NONE
    only: frozenset[str] | None = None

    @property
    def message(self) -> str:
        return self.status.last_error_message or self.status.phase.value


def reconcile(
    port: ClusterPort, settings: OperatorSettings, md: ModelDeploymentRef, *, now: datetime
) -> Outcome:
    """Bring one ModelDeployment to its spec and record the result on its status. A call
    the API server refuses (a 403 from RBAC, a 422, a quota) is recorded there too, with the
    server's words, and tried again later."""
    with _DEPLOYMENT_LOCKS.hold(md.key):
        try:
            outcome = _decided(port, settings, md, now=now)
        except ClusterError as error:
            outcome = _failed(crd.API_ERROR, str(error), now=now, retry=Retry.LATER)
        wire = outcome.status.to_wire()
        if outcome.only is not None:
            wire = {key: value for key, value in wire.items() if key in outcome.only}
        port.patch_status(md.namespace, md.name, wire)
    return outcome


def _decided(
    port: ClusterPort, settings: OperatorSettings, md: ModelDeploymentRef, *, now: datetime
) -> Outcome:
    """`_decide`, then what it decided made: placements take turns (`_LOCK`) only until
    their pod is counted (`assume`), so its Service and pod are created after the turn."""
    decided = _decide(port, settings, md, now=now)
    if isinstance(decided, Outcome):
        return decided
    try:
        # The Service first: a refusal then leaves no pod behind whose status says nothing.
        port.apply(decided.service)
        if decided.claim_template is not None:
            # AlreadyExists: the same placement's, made before (its name is its digest).
            with contextlib.suppress(AlreadyExists):
                port.create(decided.claim_template)
        try:
            port.create(decided.pod)
        except AlreadyExists:
            # The pod just deleted (an earlier generation's) is still terminating under the
            # same name: place again once it is gone (its deletion wakes the operator).
            return _terminating(md, decided.pod["metadata"]["name"], now=now)
        return decided.placed
    finally:
        port.forget(decided.pod)


def reconcile_named(
    port: ClusterPort,
    settings: OperatorSettings,
    namespace: str,
    name: str,
    *,
    now: datetime,
    seen: str | None = None,
) -> Outcome | None:
    """Reconcile a ModelDeployment read afresh (None: it is gone, or being deleted), its
    reads including resourceVersion `seen` (the event that prompted it)."""
    found = port.get_model_deployment(namespace, name)
    if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
        return None
    ref = model_deployment_ref(found)
    return reconcile(port, settings, replace(ref, seen=newest(ref.seen, seen)), now=now)


def model_deployment_ref(body: Mapping[str, Any]) -> ModelDeploymentRef:
    meta = body.get("metadata") or {}
    return ModelDeploymentRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        spec=dict(body.get("spec") or {}),
        status=dict(body.get("status") or {}),
        seen=meta.get("resourceVersion"),
    )


def waiting(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """A running deployment a later pass may still place: turned away for room that may
    come (not for good), refused by the API server, or waiting for its old pod to go."""
    if spec.get("state", "running") != "running":
        return False
    found = crd.parse_status(status)
    if found.phase is Phase.FAILED and found.last_error_code == crd.API_ERROR:
        return True
    if found.phase is Phase.FAILED and found.last_error_code == crd.NO_FIT_ERROR:
        return not (found.no_fit is not None and found.no_fit.permanent)
    return any(c.type == crd.READY and c.reason == crd.TERMINATING for c in found.conditions)


def retry_waiting(
    port: ClusterPort, settings: OperatorSettings, namespace: str | None, *, now: datetime
) -> list[str]:
    """Reconcile every ModelDeployment that is `waiting` (in `namespace`, or all); the keys
    retried. The operator runs this on a timer and whenever budget may have come free."""
    retried: list[str] = []
    for found in port.list_model_deployments(namespace):
        if (found.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if waiting(found.get("spec") or {}, found.get("status") or {}):
            ref = model_deployment_ref(found)
            reconcile(port, settings, ref, now=now)
            retried.append(ref.key)
    return retried


def observe_pod(
    port: ClusterPort, settings: OperatorSettings, pod: Mapping[str, Any], *, now: datetime
) -> Outcome | None:
    """A serving pod changed: move its ModelDeployment's phase along. A pod the scheduler
    refused is deleted (nothing is left pending) and recorded as a NoFit; one that failed
    was taken away (see `_going`) and its deployment is reconciled as for a deletion. A pod
    of another generation, or one being deleted, says nothing about the deployment now."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_DEPLOYMENT)
    namespace = meta.get("namespace")
    if not name or not namespace or meta.get("deletionTimestamp"):
        return None
    annotations = meta.get("annotations") or {}
    whole_gpu_managed = (
        settings.topology is Topology.MANAGED_CLUSTER
        and annotations.get(ANNOTATION_SHARING) == WHOLE_GPU
    )
    report = pod_report(pod, whole_gpu_managed=whole_gpu_managed)
    status = _pod_status(report, previous=None, now=now)
    at = meta.get("resourceVersion")  # what the pod reads below must include
    with _DEPLOYMENT_LOCKS.hold(f"{namespace}/{name}"):
        found = port.get_model_deployment(namespace, name)
        if found is None:
            return None
        generation = (found.get("metadata") or {}).get("generation")
        if annotations.get(ANNOTATION_GENERATION) != str(generation or 0):
            return None  # an old generation's pod: the new one is on its way
        if _going(pod) is not None:  # failed, so taken away: a loss, as a deletion is
            ref = model_deployment_ref(found)
            outcome = reconcile(port, settings, replace(ref, seen=newest(ref.seen, at)), now=now)
            release_waiting(port, settings, seen=at)
            return outcome
        if report.no_fit is not None:
            port.delete_pod(namespace, str(meta.get("name")))
            port.delete_service(namespace, name)
        patch = _partial(status, report, now=now)
        try:
            if not _recorded(found.get("status") or {}, patch):
                port.patch_status(namespace, name, patch)
        except ClusterError as error:
            if error.status != _NOT_FOUND:
                raise
    if report.no_fit is not None or not starting(pod):
        # Ready, failed, refused or still gated: a pod waiting on its devices may start.
        # A pod on its way (pending, bound, starting) frees nothing; not listing every pod
        # for each of its events is most of what a pod event costs.
        release_waiting(port, settings, seen=at)
    return Outcome(status=status, retry=Retry.LATER if report.no_fit else Retry.NONE)


def _recorded(status: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the status already says what `patch` would write: most pod events (created,
    bound, running) leave a deployment's phase and conditions as they were, and writing
    each again would only churn the object and its watchers."""

    def said(conditions: Any) -> list[tuple[Any, ...]]:
        keys = ("type", "status", "reason", "message")
        return [tuple(c.get(k) or None for k in keys) for c in conditions or []]

    return all(
        said(status.get(key)) == said(value) if key == "conditions" else status.get(key) == value
        for key, value in patch.items()
    )


def pod_gone(
    port: ClusterPort, settings: OperatorSettings, pod: Mapping[str, Any], *, now: datetime
) -> Outcome | None:
    """A serving pod was deleted: its deployment is reconciled (a pod taken from under a
    running deployment is recorded as lost; one of an old generation makes way for the new),
    and gated pods on its devices may start."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_DEPLOYMENT)
    namespace = meta.get("namespace")
    at = meta.get("resourceVersion")  # the deletion's: the reads below must include it
    outcome = None
    if name and namespace:
        outcome = reconcile_named(port, settings, str(namespace), str(name), now=now, seen=at)
    release_waiting(port, settings, seen=at)
    return outcome


def release_waiting(
    port: ClusterPort, settings: OperatorSettings, *, seen: str | None = None
) -> list[tuple[str, str]]:
    """Let start the gated pods whose devices have no engine starting any more (after a
    pod became Ready, failed or went away). Returns the (namespace, name) released."""
    with _LOCK:
        released = to_release(port.list_pods(settings.pods_namespace, seen=seen))
        for namespace, name in released:
            port.open_gate(namespace, name)
    return released


@dataclass(frozen=True, slots=True, kw_only=True)
class Placing:
    """A placement decided: the Service and pod to create, and the outcome once created."""

    service: dict[str, Any]
    pod: dict[str, Any]
    placed: Outcome
    claim_template: dict[str, Any] | None = None


def _decide(
    port: ClusterPort, settings: OperatorSettings, md: ModelDeploymentRef, *, now: datetime
) -> Outcome | Placing:
    began = time.monotonic()  # what a NoFit is confirmed against was listed after this
    previous = crd.parse_status(md.status)
    try:
        spec = crd.parse_spec(md.spec, name=md.key)
    except InvalidSpec as error:
        return _failed(crd.INVALID_SPEC, str(error), now=now, retry=Retry.NEVER)
    pod_name = f"{md.name}-engine"
    if spec.state != "running":
        port.delete_pod(md.namespace, pod_name)
        if spec.state == "stopped":
            port.delete_service(md.namespace, md.name)
        return Outcome(status=_stopped(md, now=now, paused=spec.state == "paused"))
    existing = port.get_pod(md.namespace, pod_name, seen=md.seen)
    lost: str | None = None
    if existing is not None:
        # The pod says which spec it serves: kopf may hand us a body older than our own
        # status write, so the status is no witness.
        meta = existing.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        current = annotations.get(ANNOTATION_GENERATION) == str(md.generation or 0)
        going = _going(existing)
        if going is not None:
            if current and _serving(previous, md):
                if spec.placement is None and not meta.get("deletionTimestamp"):
                    port.delete_pod(md.namespace, pod_name)  # a failed pod keeps the name
                return _lost(md, spec, previous, f"pod {md.namespace}/{pod_name} {going}", now=now)
            if current and spec.placement is not None and _lost_for_good(previous, md):
                return Outcome(status=previous)
            if meta.get("deletionTimestamp"):
                return _terminating(md, pod_name, now=now)
        else:
            report = pod_report(existing)
            if current and not report.no_fit:
                status = _pod_status(report, previous=previous, now=now)
                return Outcome(status=status, only=frozenset(_partial(status, report, now=now)))
        # The spec changed, the scheduler refused it, or it failed: placed again once gone.
        port.delete_pod(md.namespace, pod_name)
    elif _serving(previous, md):
        lost = _recorded_loss(previous) or f"pod {md.namespace}/{previous.pod_name} was deleted"
        if spec.placement is not None:
            return _lost(md, spec, previous, lost, now=now)
    elif spec.placement is not None and _lost_for_good(previous, md):
        return Outcome(status=previous)  # the control plane ends it; never placed again
    try:
        estimate = sized(md.key, spec)
        request = placement_request(md.key, spec, estimate)
    except InvalidSpec as error:
        return _failed(crd.INVALID_SPEC, str(error), now=now, retry=Retry.NEVER)
    with _LOCK:  # from what the cluster holds to the pod counted in it
        chosen = _choose(
            port, settings, md, spec, request, estimate, lost=lost, began=began, now=now
        )
        if isinstance(chosen, Placing):
            port.assume(chosen.pod)
    return chosen


def _choose(
    port: ClusterPort,
    settings: OperatorSettings,
    md: ModelDeploymentRef,
    spec: ModelDeploymentSpec,
    request: PlacementRequest,
    estimate: Estimate | None,
    *,
    lost: str | None,
    began: float,
    now: datetime,
) -> Outcome | Placing:
    """Where the deployment goes (the pod to create there), or why it cannot go yet. A
    NoFit found on what the watches hold is planned again on lists begun since `began`."""
    pod_name = f"{md.name}-engine"
    nodes, pods, view, decision = _planned(port, settings, md, spec, request, now=now)
    if isinstance(decision, NoFit):  # not on what the watches held: on what is there now
        nodes, pods, view, decision = _planned(
            port, settings, md, spec, request, now=now, listed_since=began
        )
    if isinstance(decision, NoFit) and spec.placement is not None:
        in_the_way = _in_the_way(port, nodes, pods, settings, md, spec.placement, request)
        if in_the_way:
            return _terminating(md, ", ".join(in_the_way), now=now, earlier_spec=False)
    if isinstance(decision, NoFit):
        # Final only when even the empty cluster could not hold it (the admission rule),
        # and then said as the empty cluster's refusal: what is free now is beside the point.
        never = never_fits(view.hardware, request)
        return _no_fit(never or decision, md, now=now, permanent=never is not None)
    target = ServingTarget(
        name=md.name,
        namespace=md.namespace,
        uid=md.uid,
        generation=md.generation,
        spec=spec,
        placement=decision,
        naming=view.resources[decision.node],
        launch=launch_request(md, spec, decision, estimate),
        inject_visible_devices=settings.inject_visible_devices,
        images=settings.images,
        downloader_image=settings.downloader_image,
        hard_limit_library=settings.hard_limit_library,
        host_resources=settings.engine_resources,
        run_as_user=settings.run_as_user,
    )
    try:
        pod = serving_pod(target, queued_at=crd.timestamp(now, precise=True))
    except InvalidSpec as error:
        return _failed(crd.INVALID_SPEC, str(error), now=now, retry=Retry.NEVER)
    others = [
        p
        for p in pods
        if (p.get("metadata") or {}).get("name") != pod_name
        or (p.get("metadata") or {}).get("namespace") != md.namespace
    ]
    if must_wait(others, devices_of(pod)):
        pod = serving_pod(target, queued_at=crd.timestamp(now, precise=True), gated=True)
    placed = Outcome(status=_placed(decision, target, settings, md, now=now, lost=lost))
    return Placing(
        service=serving_service(target),
        pod=pod,
        placed=placed,
        claim_template=claim_template(target),
    )


def _planned(
    port: ClusterPort,
    settings: OperatorSettings,
    md: ModelDeploymentRef,
    spec: ModelDeploymentSpec,
    request: PlacementRequest,
    *,
    now: datetime,
    listed_since: float | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ClusterView, Placement | NoFit]:
    """The nodes and pods read, the cluster they make, and the plan for `request` there.

    The pods are those held, with every pod this port wrote (and those assumed), not
    waiting for `md.seen`: on a quiet cluster no pod event may pass a ModelDeployment's
    version for minutes. A write by someone else the watch has yet to deliver can only be
    a pod gone that still counts (a NoFit, confirmed on lists begun since, `_choose`) or a
    pod made at the same moment as this decision, which any decision may miss (the
    scheduler then refuses the pod, and `observe_pod` records a NoFit tried again)."""
    if listed_since is None:
        pods = port.list_pods(settings.pods_namespace)
        nodes = port.list_nodes()
    else:  # two fresh lists: each mostly waits on the API server, so both at once
        with ThreadPoolExecutor(1, thread_name_prefix="list-nodes") as other:
            listing = other.submit(port.list_nodes, listed_since=listed_since)
            pods = port.list_pods(settings.pods_namespace, listed_since=listed_since)
            nodes = listing.result()
    claims = port.list_claims(listed_since=listed_since) if settings.dra else []
    view = view_for(nodes, pods, settings, claims)
    state = view.state.without(md.key)
    if spec.placement is None:
        # What the node agents measured: never place onto memory others hold (the control
        # plane's pins already took it into account).
        state = state.with_measurement(measured(nodes, settings, now=now))
    else:
        # The control plane reserved these slots in its own ledger: honour that choice (or
        # say why it no longer fits) rather than plan a second, possibly different, one.
        pin = spec.placement
        slots = [(slot.gpu_index, slot.partition_index) for slot in pin.slots]
        state = pinned_state(state, node=pin.node, slots=slots)
    decision = plan(state, request)
    if isinstance(decision, NoFit):
        decision = with_unschedulable_reasons(decision, state.fleet)
    return nodes, pods, view, decision


def _serving(previous: ModelDeploymentStatus, md: ModelDeploymentRef) -> bool:
    """The status says this generation's pod was placed and on its way or serving."""
    return (
        previous.pod_name is not None
        and previous.observed_generation == md.generation
        and previous.phase in (Phase.DEPLOYING, Phase.INITIALIZING, Phase.DEPLOYED)
    )


def _going(pod: Mapping[str, Any]) -> str | None:
    """Why the pod is going away, or None. An engine pod restarts its container in place
    (restartPolicy Always, a crash is CrashLoopBackOff), so it reaches phase Failed only
    when taken from outside: evicted by its kubelet, or marked by the pod garbage collector
    for a node that is gone (kubernetes pkg/controller/podgc/gc_controller.go)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "is being deleted"
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    disruption: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"), {}
    )
    why = status.get("message") or disruption.get("message") or status.get("reason")
    return f"failed ({why})" if why else "failed"


def _recorded_loss(previous: ModelDeploymentStatus) -> str | None:
    """The loss `_lost` recorded for a deployment it will place again, if it did."""
    message = previous.last_error_message or ""
    if previous.last_error_code == crd.POD_LOST and message.endswith(_AGAIN):
        return message.removesuffix(_AGAIN)
    return None


def _lost_for_good(previous: ModelDeploymentStatus, md: ModelDeploymentRef) -> bool:
    """A pinned deployment whose pod was lost (see `_lost`) stays as recorded."""
    return (
        previous.last_error_code == crd.POD_LOST
        and previous.observed_generation == md.generation
        and previous.phase in (Phase.ERROR, Phase.FAILED)
    )


def _in_the_way(
    port: ClusterPort,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: OperatorSettings,
    md: ModelDeploymentRef,
    pin: crd.PinnedPlacement,
    request: PlacementRequest,
) -> list[str]:
    """The pods on their way out ("namespace/name") without which the pin would fit, or
    none. A kubelet takes up to a pod's grace period to stop its engine, and the garbage
    collector a moment to delete the pods of a ModelDeployment deleted in the foreground;
    the control plane already gave that budget to this deployment, so it waits for them
    rather than failing."""
    on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == pin.node]
    going = [p for p in on_node if _leaving(port, p)]
    if not going:
        return []
    gone = {id(p) for p in going}
    staying = [p for p in pods if id(p) not in gone]
    view = view_for(nodes, staying, settings, port.list_claims() if settings.dra else [])
    slots = [(slot.gpu_index, slot.partition_index) for slot in pin.slots]
    later = pinned_state(view.state.without(md.key), node=pin.node, slots=slots)
    if isinstance(plan(later, request), NoFit):
        return []
    return [f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}" for p in going]


def _leaving(port: ClusterPort, pod: Mapping[str, Any]) -> bool:
    """Whether a pod is on its way out: being deleted, or owned by a ModelDeployment that is
    being deleted or is gone (its pod goes next: the garbage collector deletes a deleted
    owner's dependents, kubernetes pkg/controller/garbagecollector/garbagecollector.go). An
    owner this operator may not read counts as staying."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return True
    owner = next(
        (
            ref
            for ref in meta.get("ownerReferences") or []
            if ref.get("kind") == crd.KIND and ref.get("apiVersion") == crd.API_VERSION
        ),
        None,
    )
    if owner is None:
        return False
    try:
        found = port.get_model_deployment(str(meta.get("namespace")), str(owner.get("name")))
    except ClusterError:
        return False
    if found is None:
        return True
    owner_meta = found.get("metadata") or {}
    return owner_meta.get("uid") != owner.get("uid") or bool(owner_meta.get("deletionTimestamp"))


def _terminating(
    md: ModelDeploymentRef, pods: str, *, now: datetime, earlier_spec: bool = True
) -> Outcome:
    """Waiting for pods to go: an earlier generation's (`pods`: its name), before its
    successor takes the name, or (`earlier_spec` False) others being deleted whose budget
    the pin needs (`pods`: "namespace/name, ..."). No pod serves this generation yet, so
    none is named: the old one going is no loss."""
    if earlier_spec:
        message = f"waiting for pod {md.namespace}/{pods} of an earlier spec to terminate"
    else:
        message = f"waiting for pod(s) {pods} to terminate: the pin needs their budget"
    status = ModelDeploymentStatus(
        phase=Phase.DEPLOYING,
        conditions=(
            crd.condition(crd.PLACED, ok=False, reason=crd.TERMINATING, message=message, now=now),
            crd.condition(crd.READY, ok=False, reason=crd.TERMINATING, message=message, now=now),
        ),
        observed_generation=md.generation,
    )
    return Outcome(
        status=status,
        retry=Retry.LATER,
        only=frozenset({"phase", "conditions", "observedGeneration", "podName"}),
    )


def _lost(
    md: ModelDeploymentRef,
    spec: ModelDeploymentSpec,
    previous: ModelDeploymentStatus,
    what: str,
    *,
    now: datetime,
) -> Outcome:
    """The serving pod was taken from under a running deployment. A deployment the
    control plane pinned ends (ERROR once it had served, FAILED before): the control plane
    decides what comes next, as it does for an engine that died. Any other is recorded as
    not ready and placed again once the pod is gone."""
    served = previous.phase is Phase.DEPLOYED
    if spec.placement is None:
        message = f"{what}{_AGAIN}"
        status = previous.model_copy(
            update={
                "phase": Phase.DEPLOYING,
                "last_error_code": crd.POD_LOST,
                "last_error_message": message,
                "last_error_at": crd.timestamp(now),
                "conditions": (
                    crd.condition(
                        crd.PLACED, ok=False, reason=crd.TERMINATING, message=message, now=now
                    ),
                    crd.condition(
                        crd.READY, ok=False, reason=crd.TERMINATING, message=message, now=now
                    ),
                ),
            }
        )
        return Outcome(status=status, retry=Retry.LATER)
    status = previous.model_copy(
        update={
            "phase": Phase.ERROR if served else Phase.FAILED,
            "last_error_code": crd.POD_LOST,
            "last_error_message": what,
            "last_error_at": crd.timestamp(now),
            "conditions": (
                crd.condition(crd.PLACED, ok=False, reason="PodLost", message=what, now=now),
                crd.condition(crd.READY, ok=False, reason="PodLost", message=what, now=now),
            ),
        }
    )
    return Outcome(status=status)


def engine_settings(spec: ModelDeploymentSpec) -> EngineSettings:
    """The settings the engine is sized for and launched with: those the control plane
    carried (`spec.sizing`), else the spec's own config."""
    if spec.sizing is not None:
        return EngineSettings.from_dict(spec.sizing.settings)
    return EngineSettings(
        dtype=spec.config.dtype,
        quantization=spec.config.quantization,
        tensor_parallel=spec.tensor_parallel_size,
        max_model_len=spec.config.max_model_len,
        max_num_seqs=spec.config.max_num_seqs,
        kv_cache_dtype=spec.config.kv_cache_dtype,
    )


def sized(key: str, spec: ModelDeploymentSpec) -> Estimate | None:
    """The estimate the engine is launched with: the carried one, else ours when the spec
    gives no `vram` (then it is also the request), else None (the budget alone)."""
    if spec.sizing is not None and spec.sizing.estimate is not None:
        return Estimate.from_dict(spec.sizing.estimate)
    if spec.vram_bytes is not None:
        return None
    try:
        return estimate_model(spec.model, engine=spec.engine, settings=engine_settings(spec))
    except EstimateError as error:
        raise InvalidSpec(
            f"ModelDeployment {key}: cannot estimate {spec.model!r} ({error}); "
            "set spec.vram to the memory per GPU"
        ) from None


def launch_request(
    md: ModelDeploymentRef,
    spec: ModelDeploymentSpec,
    placement: Placement,
    estimate: Estimate | None,
) -> LaunchRequest:
    """The launch a local backend would get for this placement: the same budget, settings
    and estimate, so the shared launcher gives the pod the same engine flags."""
    return LaunchRequest.inside(
        placement,
        deployment_id=md.key,
        engine=spec.engine,
        model_path=spec.model,
        served_model_name=spec.served_model_name or spec.model,
        settings=engine_settings(spec),
        estimate=estimate,
        extra_args=spec.config.extra_args,
    )


def placement_request(
    key: str, spec: ModelDeploymentSpec, estimate: Estimate | None = None
) -> PlacementRequest:
    """The planner's request: `spec.vram` or the estimate, per GPU, rounded up to whole GiB
    (the unit budgets are published in, so our plan and the scheduler's sums agree)."""
    vram_bytes = spec.vram_bytes
    if vram_bytes is None:
        found = estimate or sized(key, spec)
        if found is None:  # unreachable: without spec.vram there is always an estimate
            raise InvalidSpec(f"ModelDeployment {key}: set spec.vram to the memory per GPU")
        vram_bytes = found.total_bytes
    try:
        return PlacementRequest(
            name=key,
            vram_bytes=gib_ceil(vram_bytes) * GIB,
            tensor_parallel=spec.tensor_parallel_size,
            vendor=Vendor(spec.required_vendor) if spec.required_vendor else None,
            min_accel_version=spec.min_accel_version,
            engine=spec.engine,
        )
    except InvalidRequest as error:
        raise InvalidSpec(f"ModelDeployment {key}: {error}") from None


def _placed(
    placement: Placement,
    target: ServingTarget,
    settings: OperatorSettings,
    md: ModelDeploymentRef,
    *,
    now: datetime,
    lost: str | None = None,
) -> ModelDeploymentStatus:
    """Placed, the pod created. `lost`: the pod this one replaces was taken away (kept
    in the last error, so the loss stays visible)."""
    return ModelDeploymentStatus(
        last_error_code=None if lost is None else crd.POD_LOST,
        last_error_message=None if lost is None else f"{lost}; placed again",
        last_error_at=None if lost is None else crd.timestamp(now),
        phase=Phase.DEPLOYING,
        topology=settings.topology.value,
        node=placement.node,
        gpu_indices=tuple(placement.gpu_indices),
        partition=placement.partition,
        hardware_class=placement.hardware_class.value,
        sharing_class=placement.sharing_class,
        gpu_vendor=placement.gpu_vendor.value,
        allocated_bytes=placement.allocated_bytes,
        allocated_capacity_gb=placement.allocated_capacity_gb,
        notices=tuple(code.value for code in placement.notices),
        pod_name=target.pod_name,
        service_name=target.service_name,
        conditions=(
            crd.condition(crd.PLACED, ok=True, reason="Placed", now=now),
            crd.condition(crd.READY, ok=False, reason="Deploying", now=now),
        ),
        observed_generation=md.generation,
    )


def _no_fit(no_fit: NoFit, md: ModelDeploymentRef, *, now: datetime, permanent: bool) -> Outcome:
    message = f"{no_fit.reason.value}: {no_fit.message}"
    failed = _failed(crd.NO_FIT_ERROR, message, now=now, retry=Retry.LATER).status
    status = failed.model_copy(
        update={
            "no_fit": crd.NoFitStatus(
                reason=no_fit.reason.value,
                message=no_fit.message,
                hint=no_fit.hint,
                requested_bytes=no_fit.requested_bytes,
                largest_free_bytes=no_fit.largest_free_bytes,
                largest_free_location=no_fit.largest_free_location,
                permanent=permanent,
            ),
            "observed_generation": md.generation,
        }
    )
    return Outcome(status=status, retry=Retry.NEVER if permanent else Retry.LATER)


def _failed(code: str, message: str, *, now: datetime, retry: Retry) -> Outcome:
    """FAILED with nothing placed: placement fields cleared (a refusal replaces whatever was
    recorded before), the error recorded."""
    status = ModelDeploymentStatus(
        phase=Phase.FAILED,
        last_error_code=code,
        last_error_message=message,
        last_error_at=crd.timestamp(now),
        conditions=(
            crd.condition(crd.PLACED, ok=False, reason=code, message=message, now=now),
            crd.condition(crd.READY, ok=False, reason=code, message=message, now=now),
        ),
    )
    return Outcome(status=status, retry=retry)


def _stopped(md: ModelDeploymentRef, *, now: datetime, paused: bool) -> ModelDeploymentStatus:
    phase = Phase.PAUSED if paused else Phase.STOPPED
    reason = phase.value.title()
    return ModelDeploymentStatus(
        phase=phase,
        service_name=md.name if paused else None,
        conditions=(
            crd.condition(crd.PLACED, ok=False, reason=reason, now=now),
            crd.condition(crd.READY, ok=False, reason=reason, now=now),
        ),
        observed_generation=md.generation,
    )


def _pod_status(
    report: PodReport, *, previous: ModelDeploymentStatus | None, now: datetime
) -> ModelDeploymentStatus:
    """The pod's view: phase and conditions from the pod alone (the body kopf hands us may
    predate our last write); transition times kept where a condition did not change."""
    base = previous or ModelDeploymentStatus()
    fresh = (
        crd.condition(crd.PLACED, ok=report.no_fit is None, reason="Placed", now=now),
        crd.condition(
            crd.READY,
            ok=report.ready,
            reason="Ready" if report.ready else (report.error_code or report.phase.value.title()),
            message=report.message,
            now=now,
        ),
    )
    before = {c.type: c for c in base.conditions}
    conditions = tuple(
        c.model_copy(update={"last_transition_time": before[c.type].last_transition_time})
        if c.type in before and before[c.type].status == c.status
        else c
        for c in fresh
    )
    status = base.model_copy(update={"phase": report.phase, "conditions": conditions})
    if report.error_code is not None:
        message = report.message
        if report.no_fit is not None:
            message = f"{report.no_fit.value}: {report.message}"
        status = status.model_copy(
            update={
                "last_error_code": report.error_code,
                "last_error_message": message,
                "last_error_at": crd.timestamp(now),
            }
        )
    return status


def _partial(status: ModelDeploymentStatus, report: PodReport, *, now: datetime) -> dict[str, Any]:
    """The fields a pod event may change; the placement fields stay as the plan wrote them
    unless the scheduler refused the pod, which clears them."""
    wire = status.to_wire()
    keys = ["phase", "conditions"]
    if report.error_code is not None:
        keys += ["lastErrorCode", "lastErrorMessage", "lastErrorAt"]
    patch = {key: wire[key] for key in keys}
    if report.no_fit is not None:
        cleared = ModelDeploymentStatus().to_wire()
        for key in ("node", "gpuIndices", "partition", "allocatedBytes", "allocatedCapacityGb"):
            patch[key] = cleared[key]
        patch["podName"] = None
    return patch
