"""The placement operator: thin kopf handlers over `controller.py`.

`python -m cohabit.kube.operator` runs it (the Helm chart's operator Deployment). Handlers
only translate: a NoFit that would not fit the empty cluster either (the admission rule,
`placement.planner.never_fits`) or a bad spec raises PermanentError and is not retried.
Whatever may succeed later (room that may come free, a call the API server refused, an old
pod still terminating) is retried by the operator's own retry thread, every
`placement.retrySeconds` and at once when one of our pods goes away. Not by a kopf timer:
kopf puts a finalizer on every object a timer serves, and then no ModelDeployment could be
deleted while the operator is down.

The operator runs standalone, never in kopf's peering: one replica with a Recreate
strategy, its decisions serialized in-process. Peering would pause it, with no error, as soon
as another kopf operator in the cluster shares kopf's default peering object.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import threading
from datetime import UTC, datetime
from typing import Any

import kopf

from cohabit.hardware.model import Topology
from cohabit.kube import controller, crd
from cohabit.kube.cluster import api_client
from cohabit.kube.controller import ModelDeploymentRef, OperatorSettings, Retry
from cohabit.kube.dra import DRA_BACKEND, PLACEMENT_BACKEND_ENV
from cohabit.kube.fleetview import topology_of
from cohabit.kube.resources import (
    DEFAULT_DOWNLOADER_IMAGE,
    DEFAULT_ENGINE_RESOURCES,
    DEFAULT_IMAGES,
    DEFAULT_RUN_AS_USER,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from cohabit.kube.watched import WatchedPort

ANNOTATION_PREFIX = "kopf.cohabit.dev"
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # where HAMi's device plugin installs it
LIVENESS_ENDPOINT = "http://0.0.0.0:8080/healthz"  # the chart's probe and containerPort
HANDLER_THREADS = 16  # kopf's executor for the (synchronous) handlers below
CONSISTENCY_TIMEOUT_S = 60.0
# The cyclic collector's thresholds (Python's `gc.set_threshold`; its defaults are 700, 10,
# 10). The operator holds every pod and node as parsed JSON, millions of objects, and reads
# thousands more for each fresh list: with the defaults, parsing one list of 1,400 pods
# (8.8 MB) took 0.4 s, nearly all of it in collections of the heap it holds; with these,
# 0.09 s (docs/benchmarks.md). Garbage in cycles waits at most 50,000 allocations longer.
GC_THRESHOLDS = (50_000, 20, 10)

log = logging.getLogger(__name__)


def settings_from_env(env: dict[str, str] | None = None) -> OperatorSettings:
    """Operator settings from the environment the Helm chart sets."""
    env = dict(os.environ) if env is None else env
    topology = topology_of(env.get("COHABIT_MODE", "standalone"))
    return OperatorSettings(
        topology=topology,
        fractional=env.get("COHABIT_FRACTIONAL", "true").lower() == "true",
        pods_namespace=(
            env.get("COHABIT_NAMESPACE") if topology is Topology.MANAGED_CLUSTER else None
        ),
        inject_visible_devices=env.get("COHABIT_BUDGET_BACKEND") == "status-patch",
        dra=env.get(PLACEMENT_BACKEND_ENV) == DRA_BACKEND,
        images=_images(env.get("COHABIT_ENGINE_IMAGES")),
        downloader_image=env.get("COHABIT_DOWNLOADER_IMAGE") or DEFAULT_DOWNLOADER_IMAGE,
        hard_limit_library=(
            env.get("COHABIT_HAMI_LIBRARY") or HAMI_LIBRARY
            if env.get("COHABIT_ENFORCE") == "hami-core"
            else None
        ),
        retry_delay_s=float(env.get("COHABIT_RETRY_S", "60")),
        watch_namespace=env.get("COHABIT_WATCH_NAMESPACE") or None,
        engine_resources=(
            json.loads(env["COHABIT_ENGINE_RESOURCES"])
            if env.get("COHABIT_ENGINE_RESOURCES")
            else DEFAULT_ENGINE_RESOURCES
        ),
        run_as_user=_user(env.get("COHABIT_RUN_AS_USER")),
    )


def _user(text: str | None) -> int | None:
    """The chart's `runAsUser`: unset, our default; empty, none (OpenShift assigns one)."""
    if text is None:
        return DEFAULT_RUN_AS_USER
    return int(text) if text.strip() else None


def port_from_env(settings: OperatorSettings, env: dict[str, str] | None = None) -> WatchedPort:
    """The API server (in-cluster account or kubeconfig), restricted to the nodes the
    chart's `placement.nodeSelector` names, those nodes and the pods the settings count
    watched."""
    env = dict(os.environ) if env is None else env
    return WatchedPort(
        api_client(connections=HANDLER_THREADS + 4),  # and the retrier's, and three watches
        namespace=settings.pods_namespace,
        node_selector=env.get("COHABIT_NODE_SELECTOR", ""),
        claims=settings.dra,
    )


class Retrier:
    """The thread that retries deployments `controller.waiting` names: every `interval_s`,
    and at once when `wake()` says budget may have come free."""

    def __init__(self, port: controller.ClusterPort, settings: OperatorSettings) -> None:
        self.port = port
        self.settings = settings
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retry", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.retry_delay_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                controller.retry_waiting(
                    self.port, self.settings, self.settings.watch_namespace, now=_now()
                )
            except Exception:  # a failed pass must not end the thread; the next one retries
                log.exception("retrying waiting ModelDeployments failed")


def _images(text: str | None) -> dict[str, dict[str, str]]:
    """The chart's `engines.images` (JSON), over the defaults engine by engine."""
    images = {engine: dict(by_vendor) for engine, by_vendor in DEFAULT_IMAGES.items()}
    if text:
        for engine, by_vendor in json.loads(text).items():
            images.setdefault(engine, {}).update(by_vendor)
    return images


def register(registry: kopf.OperatorRegistry) -> None:
    """Attach the handlers to `registry`."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        # Progress in annotations: a strict CRD schema would prune kopf's status fields.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.posting.enabled = False
        # The namespace and the CRD are fixed at install: no scanning, so no RBAC to list
        # namespaces or CRDs beyond what the chart grants.
        settings.scanning.disabled = True
        settings.peering.standalone = True
        # Handlers wait on the API server far more than they compute: more threads than
        # kopf's default (CPUs + 4) let status writes overlap while decisions take turns.
        settings.execution.max_workers = HANDLER_THREADS
        # How long kopf waits to see its own patch come back on its watch before it takes
        # the object as it last saw it; a busy API server can be slower than kopf's 5 s,
        # and each such miss ran a deployment's handler a second time.
        settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT_S
        if getattr(memo, "port", None) is None:
            memo.settings = settings_from_env()
            memo.port = port_from_env(memo.settings)
        if isinstance(memo.port, WatchedPort):
            memo.port.start()
        memo.retrier = Retrier(memo.port, memo.settings)
        memo.retrier.start()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The official client's login (in-cluster account, else the kubeconfig), the one the
        # port uses. A registry of our own gets none of kopf's fallback logins: without this
        # the operator could not authenticate at all.
        return kopf.login_via_client(**kwargs)

    @kopf.on.cleanup(registry=registry)
    def stop_retrying(memo: kopf.Memo, **_: Any) -> None:
        memo.retrier.stop()
        if isinstance(memo.port, WatchedPort):
            memo.port.stop()

    @kopf.on.resume(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    @kopf.on.create(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    @kopf.on.update(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    def deploy(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        outcome = controller.reconcile(memo.port, memo.settings, _ref(body), now=_now())
        if outcome.retry is Retry.NEVER:
            raise kopf.PermanentError(outcome.message)

    @kopf.on.event(crd.GROUP, crd.VERSION, crd.PLURAL, when=_deleted, registry=registry)
    def deployment_deleted(memo: kopf.Memo, **_: Any) -> None:
        memo.retrier.wake()  # its pod goes with it: budget comes free

    @kopf.on.event("v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
    def pod_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        if event.get("type") in ("ADDED", "MODIFIED", None):
            controller.observe_pod(memo.port, memo.settings, event["object"], now=_now())
        elif event.get("type") == "DELETED":
            controller.pod_gone(memo.port, memo.settings, event["object"], now=_now())
            memo.retrier.wake()


def _deleted(event: kopf.RawEvent, **_: Any) -> bool:
    """Only deletions (a filter, so the status writes' events are not logged as handled)."""
    return event.get("type") == "DELETED"


def _ref(body: kopf.Body) -> ModelDeploymentRef:
    return controller.model_deployment_ref(body)


def _now() -> datetime:
    return datetime.now(UTC)


def collect_less() -> None:
    """Run the cyclic garbage collector less often (see `GC_THRESHOLDS`)."""
    gc.set_threshold(*GC_THRESHOLDS)


def main() -> None:
    """Run the operator in the namespace the chart gives it (all namespaces when unset)."""
    # What `kopf run` does first (kopf/cli.py: each record prefixed with its object):
    # without a handler on the root logger only warnings reached the pod's log, through
    # Python's last-resort handler, and no handler's outcome. The liveness probe's requests
    # are left out.
    kopf.configure(log_prefix=None)
    collect_less()
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    registry = kopf.OperatorRegistry()
    register(registry)
    namespace = settings_from_env().watch_namespace
    kopf.run(
        registry=registry,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else [],
        standalone=True,
        liveness_endpoint=os.environ.get("COHABIT_LIVENESS_ENDPOINT") or LIVENESS_ENDPOINT,
    )


if __name__ == "__main__":
    main()
