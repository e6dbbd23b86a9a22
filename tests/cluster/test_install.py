"""The chart installed with the real `helm install` on the real API server, in every mode it
offers, its operator then run here as the chart's own ServiceAccount; and uninstalled again.

Nodes are kwok's (harness.py), shaped like recorded ones: the T4 edge box as our agent labels
it. Budgets come from the node's allocatable, which the real kube-scheduler enforces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cohabit.kube import crd
from tests.cluster.conftest import Nodes, Releases
from tests.cluster.harness import (
    Cluster,
    HostProcess,
    Release,
    run_operator,
    values_for,
    wait_for,
)

MODES: dict[str, dict[str, Any]] = {
    "standalone": {},
    "standalone-status-patch": {"agent": {"budgetBackend": "status-patch"}},
    "standalone-whole-gpu": {"placement": {"vramPluginV2": {"enabled": False}}},
    "managed": {"mode": "managed"},
}


def model_deployment(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": "llamacpp", **spec},
    }


def apply(api: client.ApiClient, doc: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        crd.GROUP,
        crd.VERSION,
        doc["metadata"]["namespace"],
        crd.PLURAL,
        doc,
        field_validation="Strict",
    )


def status_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL, name
    )
    return dict(found.get("status") or {})


def phase(api: client.ApiClient, namespace: str, name: str, *wanted: str) -> dict[str, Any]:
    """Wait until the ModelDeployment's phase is one of `wanted`; its status."""
    return wait_for(
        lambda: (s := status_of(api, namespace, name)).get("phase") in wanted and s,
        what=f"{name} to reach {' or '.join(wanted)}",
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_helm_installs_and_uninstalls_the_chart(
    cluster: Cluster, namespace: str, nodes: Nodes, releases: Releases, mode: str
) -> None:
    """Every object the chart renders is accepted, and its controllers make the pods: the
    operator's Deployment gets a pod admitted (Pod Security), scheduled and Ready (kwok)."""
    nodes.add("cpu")
    release = releases.install(values_for(namespace, **MODES[mode]))
    apps = client.AppsV1Api(cluster.api())
    wait_for(
        lambda: (
            apps.read_namespaced_deployment(
                f"{release.name}-operator", namespace
            ).status.ready_replicas
            == 1
        ),
        what="the operator Deployment's pod to be admitted, scheduled and Ready",
    )
    names = {d.metadata.name for d in apps.list_namespaced_deployment(namespace).items}
    assert f"{release.name}-operator" in names
    daemonsets = {d.metadata.name for d in apps.list_namespaced_daemon_set(namespace).items}
    assert (f"{release.name}-agent" in daemonsets) == (mode != "managed")
    release.uninstall()
    assert not apps.list_namespaced_deployment(namespace).items
    assert not apps.list_namespaced_daemon_set(namespace).items
    rbac = client.RbacAuthorizationV1Api(cluster.api())
    assert not [
        r for r in rbac.list_cluster_role().items if r.metadata.name.startswith(release.name)
    ]


@pytest.fixture
def standalone(
    namespace: str, releases: Releases, tmp_path: Path
) -> Iterator[tuple[Release, HostProcess]]:
    release = releases.install(values_for(namespace))
    operator = run_operator(release, tmp_path)
    yield release, operator
    operator.stop()


def test_two_models_share_a_t4_and_a_third_is_refused_without_a_pod(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    standalone: tuple[Release, HostProcess],
) -> None:
    node = nodes.recorded("labels_t4_standalone.json", "t4")
    for name in ("model-a", "model-b"):
        apply(api, model_deployment(name, namespace, model="/models/m.gguf", vram="6GiB"))
        status = phase(api, namespace, name, "DEPLOYED", "FAILED", "ERROR")
        assert status["phase"] == "DEPLOYED", status
        assert (status["node"], status["gpuIndices"]) == (node, [0])
    apply(api, model_deployment("model-c", namespace, model="/models/m.gguf", vram="6GiB"))
    status = phase(api, namespace, "model-c", "FAILED", "DEPLOYED")
    assert status["lastErrorCode"] == crd.NO_FIT_ERROR
    assert status["lastErrorMessage"].startswith("insufficient_capacity")
    core = client.CoreV1Api(api)
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items}
    assert "model-c-engine" not in pods
    for name in ("model-a", "model-b"):
        pod = pods[f"{name}-engine"]
        assert (pod.spec.node_name, pod.status.phase) == (node, "Running")
