"""Fixtures of the cluster tests: one real control plane per run (harness.py), and for each
test its own namespace and its own nodes, so tests run beside each other on one cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.controlplane import T4, Chart, install_with_api
from tests.cluster.harness import (
    Cluster,
    HostProcess,
    Release,
    apply_crd,
    given_cluster,
    install,
    kwok_node,
    local_cluster,
    node_ready,
    run_api,
    run_operator,
    unique,
    wait_for,
)
from tests.conftest import recorded_node
from tests.store.databases import database_url, fresh_database_url

__all__ = ["database_url"]  # SQLite and PostgreSQL, for the in-process control plane

HERE = Path(__file__).parent
NO_GO = "Go is not installed, and the Kubernetes control plane they run on is built with it"


def _without_go() -> bool:
    return given_cluster() is None and shutil.which("go") is None


def pytest_report_header(config: pytest.Config) -> str | None:
    if _without_go() and os.environ.get("CI", "").lower() != "true":
        return f"cluster tests: not run: {NO_GO}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without Go the cluster tests are left out, said once in the header; under CI=true
    they stay, and fail (`harness.unavailable`)."""
    if not _without_go() or os.environ.get("CI", "").lower() == "true":
        return
    dropped = [item for item in items if HERE in item.path.parents]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if HERE not in item.path.parents]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The run's cluster (scripts/test.sh starts it), else one of this session's own."""
    found = given_cluster()
    if found is not None:
        apply_crd(found)
        yield found
        return
    with local_cluster(tmp_path_factory.mktemp("cluster")) as started:
        apply_crd(started)
        yield started


@pytest.fixture
def api(cluster: Cluster) -> Iterator[client.ApiClient]:
    """The cluster administrator's client."""
    with cluster.api() as admin:
        yield admin


@pytest.fixture
def namespace(api: client.ApiClient) -> Iterator[str]:
    """A namespace of the test's own, deleted (not waited for) afterwards."""
    core = client.CoreV1Api(api)
    name = unique("t")
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: _has_default_account(core, name), what=f"namespace {name}'s ServiceAccount")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture
def tenant_namespace(api: client.ApiClient, namespace: str) -> Iterator[str]:
    """A second namespace of the test's, for another tenant's workloads; deleted (not
    waited for) afterwards."""
    core = client.CoreV1Api(api)
    name = unique("team")
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: _has_default_account(core, name), what=f"namespace {name}'s ServiceAccount")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _has_default_account(core: client.CoreV1Api, namespace: str) -> bool:
    return any(
        sa.metadata.name == "default"
        for sa in core.list_namespaced_service_account(namespace).items
    )


class Nodes:
    """Creates the test's nodes (kwok's to play, labelled with the test's group) and deletes
    them afterwards. Node names are cluster-wide: each starts with the test's namespace."""

    def __init__(self, api: client.ApiClient, group: str) -> None:
        self.core = client.CoreV1Api(api)
        self.group = group
        self.created: list[str] = []

    def add(
        self,
        short: str,
        *,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
        allocatable: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        ready: bool = True,
    ) -> str:
        """A node `<namespace>-<short>`; waits until it is Ready and schedulable unless
        `ready` is False (then nobody plays its kubelet)."""
        name = f"{self.group}-{short}"
        body = kwok_node(
            name,
            labels=labels or {},
            capacity=capacity or {},
            allocatable=allocatable,
            group=self.group,
            managed_by_kwok=ready,
        )
        if taints:
            body["spec"] = {"taints": taints}
        self.core.create_node(body)
        self.created.append(name)
        if ready:
            wait_for(lambda: node_ready(self.core, name), what=f"node {name} to be Ready")
        return name

    def recorded(self, fixture: str, short: str, **changes: Any) -> str:
        """A node shaped like a recorded one (tests/fixtures/kube or hardware): its labels,
        capacity and allocatable, as the GPU operator or our agent left them. `labels`,
        `capacity` and `allocatable` in `changes` are laid over the recorded ones."""
        recorded = recorded_node(fixture)
        labels = {k: v for k, v in recorded["labels"].items() if k != "kubernetes.io/hostname"}
        return self.add(
            short,
            labels={**labels, **changes.pop("labels", {})},
            capacity={**(recorded.get("capacity") or {}), **changes.pop("capacity", {})},
            allocatable={**(recorded.get("allocatable") or {}), **changes.pop("allocatable", {})},
            **changes,
        )

    def delete_all(self) -> None:
        for name in self.created:
            try:
                self.core.delete_node(name)
            except client.exceptions.ApiException as error:
                if error.status != 404:
                    raise


@pytest.fixture
def nodes(api: client.ApiClient, namespace: str) -> Iterator[Nodes]:
    made = Nodes(api, namespace)
    yield made
    made.delete_all()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "logs"
    folder.mkdir()
    return folder


class Releases:
    """Installs the chart for a test and uninstalls every release it made afterwards
    (their ClusterRoles and bindings are cluster-wide)."""

    def __init__(self, cluster: Cluster, namespace: str, folder: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.folder = folder
        self.made: list[Release] = []

    def install(self, values: dict[str, Any], **options: Any) -> Release:
        release = install(self.cluster, self.namespace, values, self.folder, **options)
        self.made.append(release)
        return release

    def uninstall_all(self) -> None:
        for release in self.made:
            release.uninstall(wait=False)


@pytest.fixture
def releases(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Releases]:
    made = Releases(cluster, namespace, tmp_path)
    yield made
    made.uninstall_all()


class Operators:
    """Installs the chart and runs its operator here (`run_operator`) for a test; stops
    every operator it started afterwards, before the releases are uninstalled, printing
    each one's log (pytest shows it for a failed test)."""

    def __init__(self, releases: Releases, folder: Path) -> None:
        self.releases = releases
        self.folder = folder
        self.running: list[HostProcess] = []

    def start(self, values: dict[str, Any]) -> Release:
        release = self.releases.install(values)
        self.run(release)
        return release

    def run(self, release: Release, *, kubeconfig: Path | None = None) -> HostProcess:
        """(Re)start the operator of an installed release (`kubeconfig`: as another
        identity than the chart's ServiceAccount)."""
        process = run_operator(release, self.folder, kubeconfig=kubeconfig)
        self.running.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.running:
            process.stop()
            print(f"--- {process.name} ---\n{process.output()[-6000:]}")


@pytest.fixture
def operators(releases: Releases, tmp_path: Path) -> Iterator[Operators]:
    made = Operators(releases, tmp_path)
    yield made
    made.stop_all()


# --- the control plane (controlplane.py) ---------------------------------------------------


@pytest.fixture
def postgres_url(tmp_path: Path) -> Iterator[str]:
    """A fresh database on the run's PostgreSQL: the store `--backend kubernetes` needs."""
    yield from fresh_database_url("postgresql", tmp_path)


@pytest.fixture
def t4(nodes: Nodes) -> str:
    """The test's T4 node (our agent's edge box, one 15 GiB budget), there before the
    control plane starts: it reads the cluster when it starts, then every fleet refresh."""
    return nodes.recorded(T4, "t4")


@pytest.fixture
def chart(
    cluster: Cluster, releases: Releases, postgres_url: str, log_dir: Path, t4: str
) -> Iterator[Chart]:
    """The chart with its API on PostgreSQL, its operator and API running here."""
    release = install_with_api(releases, cluster, postgres_url)
    operator = run_operator(release, log_dir)
    api = run_api(release, log_dir)
    yield Chart(release=release, api=api, operator=operator)
    api.process.stop()
    operator.stop()


class ClusterRbac:
    """Cluster-wide RBAC a test grants ServiceAccounts (ClusterRoles and their bindings),
    deleted afterwards."""

    def __init__(self, api: client.ApiClient) -> None:
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.made: list[tuple[str, str]] = []

    def bind(
        self,
        name: str,
        rules: list[dict[str, Any]] | None,
        role: str,
        account: tuple[str, str],
    ) -> None:
        """Bind the ClusterRole `role` (made with `rules`, unless None: it exists) to the
        ServiceAccount (namespace, name), as binding `name`."""
        if rules is not None:
            self.rbac.create_cluster_role({"metadata": {"name": role}, "rules": rules})
            self.made.append(("ClusterRole", role))
        namespace, service_account = account
        self.rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
                ],
            }
        )
        self.made.append(("ClusterRoleBinding", name))

    def delete_all(self) -> None:
        for kind, name in reversed(self.made):
            delete = (
                self.rbac.delete_cluster_role
                if kind == "ClusterRole"
                else self.rbac.delete_cluster_role_binding
            )
            try:
                delete(name)
            except client.exceptions.ApiException as error:
                if error.status != 404:
                    raise


@pytest.fixture
def cluster_rbac(api: client.ApiClient) -> Iterator[ClusterRbac]:
    made = ClusterRbac(api)
    yield made
    made.delete_all()
