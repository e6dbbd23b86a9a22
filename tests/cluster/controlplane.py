"""`cohabit serve --backend kubernetes` over the real cluster, for the control plane tests: the
chart installed with its API (`api.enabled`, the two Secrets it reads made first), then run
as the chart runs it (harness.run_api) or, where a test needs SQLite or to reach into the
store, the same app in this process (`control_plane`), always as the chart's ServiceAccount;
and what the tests read and watch on the cluster meanwhile."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from kamiwaza_sdk import KamiwazaClient
from kubernetes import client, config, watch

from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.runtime import BackendSettings, kubernetes_backend
from cohabit.service.app import Backend, create_app
from cohabit.units import GIB
from tests.cluster.harness import (
    WAIT_S,
    ApiServer,
    Cluster,
    HostProcess,
    Release,
    container_env,
    create_secret,
    secret_data,
    unique,
    values_for,
    wait_for,
)
from tests.service.server import serving_app, settings_for

if TYPE_CHECKING:
    from tests.cluster.conftest import Releases

API_TOKEN = "cohabit-test-admin-token"
DATABASE_SECRET = "cohabit-database"  # the chart's default names, given explicitly
TOKEN_SECRET = "cohabit-api-token"
T4 = "labels_t4_standalone.json"  # our agent's T4 edge box: one 15 GiB budget
BUDGET = "cohabit.dev/vram-gb-gpu-{}"
# How often the in-process app re-reads the cluster: each read lists nodes, pods and
# ModelDeployments; `cohabit serve` itself keeps create_app's default.
FLEET_REFRESH_S = 0.5


@dataclass(frozen=True, slots=True)
class Chart:
    """The chart installed with its API, and its API and operator running here (the
    `chart` fixture)."""

    release: Release
    api: ApiServer
    operator: HostProcess


def install_with_api(
    releases: Releases, cluster: Cluster, database_url: str, **values: Any
) -> Release:
    """The chart with `api.enabled`, after the Secrets its API Deployment reads (the
    database URL and the admin token) exist in the test's namespace."""
    namespace = releases.namespace
    create_secret(cluster, namespace, DATABASE_SECRET, {"url": database_url})
    create_secret(cluster, namespace, TOKEN_SECRET, {"token": API_TOKEN})
    api = {"enabled": True, "databaseSecret": DATABASE_SECRET, "tokenSecret": TOKEN_SECRET}
    return releases.install(values_for(namespace, api=api, **values))


def sdk(url: str) -> KamiwazaClient:
    """The published client as a user holds it: the API root and the admin token."""
    return KamiwazaClient(base_url=url, api_key=API_TOKEN)


def backend_settings(release: Release) -> BackendSettings:
    """What the chart's API reads from its environment (namespace, mode, node selector)."""
    container = release.container("Deployment", "api")
    names = [DATABASE_SECRET, TOKEN_SECRET]
    env = container_env(
        container,
        namespace=release.namespace,
        secrets=secret_data(release.cluster, release.namespace, names),
    )
    return BackendSettings.from_env(env)


@contextmanager
def control_plane(
    release: Release, folder: Path, database_url: str, **settings: Any
) -> Iterator[httpx.Client]:
    """The app `cohabit serve --backend kubernetes` builds (kube.runtime.kubernetes_backend)
    with the chart's API environment and a token of its ServiceAccount, on `database_url`
    (SQLite too, which the command refuses: the wiring is the same), served over HTTP on a
    loopback port from this process; yields a client on …/api. `settings`: more
    `Settings` fields."""
    backend = backend_settings(release)
    kubeconfig = release.kubeconfig("Deployment", "api", folder)
    with config.new_client_from_config(str(kubeconfig)) as api:
        wired = kubernetes_backend(
            KubernetesPort(api, node_selector=backend.node_selector), backend
        )
        app = create_app(
            settings_for(folder, database_url, **settings),
            Backend(
                runtime=wired.runtime,
                fleet=wired.fleet_source(),
                fleet_source=wired.fleet_source,
                fleet_refresh_s=FLEET_REFRESH_S,
                budget_unit_bytes=GIB,
                measure=wired.measure,
            ),
        )
        with serving_app(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            yield http


# --- what the tests read on the cluster ----------------------------------------------------


def model_deployments(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    found = client.CustomObjectsApi(api).list_namespaced_custom_object(
        crd.GROUP, crd.VERSION, namespace, crd.PLURAL
    )
    return {md["metadata"]["name"]: md for md in found["items"]}


def pods(api: client.ApiClient, namespace: str) -> dict[str, client.V1Pod]:
    return {p.metadata.name: p for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items}


def running_pod(api: client.ApiClient, namespace: str, name: str) -> client.V1Pod:
    """Wait until pod `name` is bound and Running (kwok's kubelet); the pod."""
    return wait_for(
        lambda: (
            (p := pods(api, namespace).get(name)) is not None
            and p.spec.node_name
            and p.status.phase == "Running"
            and p
        ),
        what=f"pod {namespace}/{name} to run",
    )


def pods_version(api: client.ApiClient, namespace: str) -> str:
    """The resourceVersion of a list of the namespace's pods: where a later watch starts."""
    version: str = client.CoreV1Api(api).list_namespaced_pod(namespace).metadata.resource_version
    return version


def pods_added_since(api: client.ApiClient, namespace: str, version: str) -> list[str]:
    """The name of every pod created in `namespace` from `version` (`pods_version`) to now,
    even one deleted again at once. A marker pod is created, and the watch read from
    `version` until the marker's ADDED: a watch delivers every change after the version it
    starts from, then the live ones, in resourceVersion order (k8s.io/apiserver
    pkg/storage/cacher: watch_cache.go getAllEventsSinceLocked, cache_watcher.go
    processInterval), so no pod made before the marker can be missed."""
    core = client.CoreV1Api(api)
    marker = unique("marker")
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": marker},
            # Gated: never scheduled, so it holds nothing and runs nowhere.
            "spec": {
                "schedulingGates": [{"name": "cohabit-test/marker"}],
                "containers": [{"name": "marker", "image": "marker"}],
            },
        },
    )
    added: list[str] = []
    stream = watch.Watch()
    try:
        for event in stream.stream(
            core.list_namespaced_pod,
            namespace,
            resource_version=version,
            timeout_seconds=int(WAIT_S),
        ):
            name = event["object"].metadata.name
            if event["type"] == "ADDED":
                if name == marker:
                    return added
                added.append(name)
    finally:
        stream.stop()
        core.delete_namespaced_pod(marker, namespace)
    raise AssertionError(f"the watch from {version} never showed the marker pod {marker}")


def tenant_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    node: str,
    gib: int,
    gpu_index: int = 0,
) -> client.V1Pod:
    """Another tenant's pod holding `gib` of a GPU's budget on `node`, as any workload asks
    for our extended resource; placed by the real scheduler and Running (kwok). Waits for
    it to run."""
    client.CoreV1Api(api).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "model",
                        "image": "their/model",
                        "resources": {"limits": {BUDGET.format(gpu_index): str(gib)}},
                    }
                ],
            },
        },
    )
    return running_pod(api, namespace, name)


def only_slot(hardware: list[dict[str, Any]]) -> Mapping[str, Any]:
    """The one slot of the one node of GET /cluster/hardware (the fleet last stored)."""
    (node,) = hardware
    (slot,) = node["slots"]
    found: Mapping[str, Any] = slot
    return found
