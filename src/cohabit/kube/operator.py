"""The placement operator: thin kopf handlers over `controller.py`.

`python -m cohabit.kube.operator` runs it (the Helm chart's operator Deployment); tests call
`register()` on a fresh registry and run `kopf.operator()` against an emulated API server.
Handlers only translate: a NoFit that may fit later raises TemporaryError (kopf retries after
the delay), one that would not fit the empty cluster either (the admission rule,
`placement.planner.never_fits`) or a bad spec raises PermanentError and is not retried.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

import kopf

from cohabit.hardware.model import Topology
from cohabit.kube import controller, crd
from cohabit.kube.cluster import KubernetesPort, api_client
from cohabit.kube.controller import ModelDeploymentRef, OperatorSettings, Outcome, Retry
from cohabit.kube.fleetview import topology_of
from cohabit.kube.resources import (
    DEFAULT_DOWNLOADER_IMAGE,
    DEFAULT_IMAGES,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)

ANNOTATION_PREFIX = "kopf.cohabit.dev"
HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # where HAMi's device plugin installs it


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
        images=_images(env.get("COHABIT_ENGINE_IMAGES")),
        downloader_image=env.get("COHABIT_DOWNLOADER_IMAGE") or DEFAULT_DOWNLOADER_IMAGE,
        hard_limit_library=(
            env.get("COHABIT_HAMI_LIBRARY") or HAMI_LIBRARY
            if env.get("COHABIT_ENFORCE") == "hami-core"
            else None
        ),
        retry_delay_s=float(env.get("COHABIT_RETRY_S", "60")),
    )


def _images(text: str | None) -> dict[str, dict[str, str]]:
    """The chart's `engines.images` (JSON), over the defaults engine by engine."""
    images = {engine: dict(by_vendor) for engine, by_vendor in DEFAULT_IMAGES.items()}
    if text:
        for engine, by_vendor in json.loads(text).items():
            images.setdefault(engine, {}).update(by_vendor)
    return images


def register(registry: kopf.OperatorRegistry, *, retry_delay_s: float = 60.0) -> None:
    """Attach the handlers to `registry`. `retry_delay_s` paces the timer that retries
    deployments waiting for room."""

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
        if getattr(memo, "port", None) is None:
            memo.port = KubernetesPort(api_client())
            memo.settings = settings_from_env()

    @kopf.on.resume(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    @kopf.on.create(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    @kopf.on.update(crd.GROUP, crd.VERSION, crd.PLURAL, registry=registry)
    def deploy(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        outcome = controller.reconcile(memo.port, memo.settings, _ref(body), now=_now())
        _raise_for(outcome, delay_s=memo.settings.retry_delay_s)

    @kopf.timer(
        crd.GROUP,
        crd.VERSION,
        crd.PLURAL,
        interval=retry_delay_s,
        initial_delay=retry_delay_s,
        when=_waiting_for_room,
        registry=registry,
    )
    def retry(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        controller.reconcile(memo.port, memo.settings, _ref(body), now=_now())

    @kopf.on.event("v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY}, registry=registry)
    def pod_changed(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        if event.get("type") in ("ADDED", "MODIFIED", None):
            controller.observe_pod(memo.port, memo.settings, event["object"], now=_now())
        elif event.get("type") == "DELETED":  # a starting engine went away: next in line
            controller.release_waiting(memo.port, memo.settings)


def _ref(body: kopf.Body) -> ModelDeploymentRef:
    meta = body.get("metadata", {})
    return ModelDeploymentRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        spec=dict(body.get("spec") or {}),
        status=dict(body.get("status") or {}),
    )


def _raise_for(outcome: Outcome, *, delay_s: float) -> None:
    if outcome.retry is Retry.NEVER:
        raise kopf.PermanentError(outcome.message)
    if outcome.retry is Retry.LATER:
        raise kopf.TemporaryError(outcome.message, delay=delay_s)


def _waiting_for_room(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """A running deployment the scheduler or the planner turned away for lack of room
    that may come (not one that would not fit the empty cluster either)."""
    return (
        spec.get("state", "running") == "running"
        and status.get("phase") == crd.Phase.FAILED.value
        and status.get("lastErrorCode") == crd.NO_FIT_ERROR
        and not (status.get("noFit") or {}).get("permanent", False)
    )


def _now() -> datetime:
    return datetime.now(UTC)


def main() -> None:
    """Run the operator in the namespace the chart gives it (all namespaces when unset)."""
    registry = kopf.OperatorRegistry()
    settings = settings_from_env()
    register(registry, retry_delay_s=settings.retry_delay_s)
    namespace = os.environ.get("COHABIT_WATCH_NAMESPACE")
    kopf.run(
        registry=registry,
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else [],
        liveness_endpoint="http://0.0.0.0:8080/healthz",
    )


if __name__ == "__main__":
    main()
