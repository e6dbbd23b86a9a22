"""The chart installed with the real `helm install` on the real API server, in every mode it
offers, its workloads' pods admitted (Pod Security, an OpenShift-like user-id rule), its
operator then run here as the chart's own ServiceAccount; and uninstalled again.

Nodes are kwok's (harness.py), shaped like recorded ones: the T4 edge box as our agent labels
it. Budgets come from the node's allocatable, which the real kube-scheduler enforces. kwok
plays the kubelet, so "Running" means admitted, scheduled and bound, not that a container
ran."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.cluster.conftest import Nodes, Releases
from tests.cluster.harness import (
    CHART,
    Cluster,
    Release,
    apply,
    enforce_pod_security,
    model_deployment,
    phase,
    run_operator,
    values_for,
    wait_for,
)

API = {"api": {"enabled": True}}
MODES: dict[str, dict[str, Any]] = {
    "standalone": {},
    "standalone-status-patch": {"agent": {"budgetBackend": "status-patch"}},
    "standalone-whole-gpu": {"placement": {"vramPluginV2": {"enabled": False}}},
    "standalone-with-api": {**API, "api": {"enabled": True, "metrics": {"tokenSecret": "m"}}},
    "managed": {"mode": "managed"},
    "managed-with-api": {"mode": "managed", **API},
}


def secrets(api: client.ApiClient, namespace: str) -> None:
    """The Secrets the API's pod reads (templates/api.yaml), as the docs have users make."""
    core = client.CoreV1Api(api)
    for name, key, value in (
        ("cohabit-database", "url", "postgresql+psycopg://cohabit@db:5432/cohabit"),
        ("cohabit-api-token", "token", "t0ken"),
        ("m", "token", "m3trics"),
    ):
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": name}, "stringData": {key: value}}
        )


def ready(api: client.ApiClient, release: Release, component: str) -> bool:
    """The Deployment's one pod was admitted, scheduled and reported Ready."""
    apps = client.AppsV1Api(api)
    name = f"{release.name}-{component}"
    return apps.read_namespaced_deployment(name, release.namespace).status.ready_replicas == 1


def refusals(api: client.ApiClient, namespace: str) -> list[str]:
    """Why controllers could not create pods here: their FailedCreate events' messages."""
    events = client.CoreV1Api(api).list_namespaced_event(namespace).items
    return [e.message for e in events if e.reason == "FailedCreate"]


@pytest.mark.parametrize("mode", list(MODES))
def test_helm_installs_and_uninstalls_the_chart(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    mode: str,
) -> None:
    """Every object the chart renders is accepted, and its controllers make the pods: the
    operator's (and the API's) Deployment gets a pod admitted, scheduled and Ready; the
    agent's DaemonSet one per node. Uninstalling removes every object, cluster-wide too."""
    nodes.add("cpu")
    secrets(api, namespace)
    release = releases.install(values_for(namespace, **MODES[mode]))
    wait_for(lambda: ready(api, release, "operator"), what="the operator's pod")
    if "api" in MODES[mode]:
        wait_for(lambda: ready(api, release, "api"), what="the API's pod")
    apps = client.AppsV1Api(api)
    daemonsets = {d.metadata.name for d in apps.list_namespaced_daemon_set(namespace).items}
    assert (f"{release.name}-agent" in daemonsets) == mode.startswith("standalone")
    release.uninstall()
    assert not apps.list_namespaced_deployment(namespace).items
    assert not apps.list_namespaced_daemon_set(namespace).items
    rbac = client.RbacAuthorizationV1Api(cluster.api())
    assert not [
        r for r in rbac.list_cluster_role().items if r.metadata.name.startswith(release.name)
    ]
    assert not [
        b
        for b in rbac.list_cluster_role_binding().items
        if b.metadata.name.startswith(release.name)
    ]


def test_helm_install_with_its_crd_where_the_crd_is_there(
    api: client.ApiClient, namespace: str, releases: Releases
) -> None:
    """A second release, or an install after the administrator applied the CRD: Helm 4
    server-side-applies the chart's crds/ over the CRD that is there, the same content."""
    release = releases.install(values_for(namespace, mode="managed"), crds=True)
    assert client.AppsV1Api(api).read_namespaced_deployment(f"{release.name}-operator", namespace)


def test_a_managed_install_runs_under_the_restricted_pod_security_profile(
    api: client.ApiClient, namespace: str, nodes: Nodes, releases: Releases
) -> None:
    """A managed cluster's namespace often enforces Pod Security `restricted`: the operator's
    and the API's pods are admitted there (non-root, no privilege escalation, no
    capabilities, the runtime's seccomp profile)."""
    nodes.add("cpu")
    enforce_pod_security(api, namespace, "restricted")
    secrets(api, namespace)
    release = releases.install(values_for(namespace, mode="managed", **API))
    wait_for(lambda: ready(api, release, "operator"), what="the operator's pod")
    wait_for(lambda: ready(api, release, "api"), what="the API's pod")
    assert not refusals(api, namespace)


# OpenShift's restricted-v2 SCC admits a pod only with no runAsUser or one in the range the
# namespace's openshift.io/sa.scc.uid-range annotation gives, and assigns one itself
# (openshift/apiserver-library-go pkg/securitycontextconstraints). No OpenShift runs here:
# this admission policy, enforced by the real API server, refuses what that rule refuses
# (it does not assign a user, which only matters to a container that runs).
UID_RANGE = (1000680000, 1000689999)
_IN_RANGE = f"(x >= {UID_RANGE[0]} && x <= {UID_RANGE[1]})"
SCC_RULE = f"""
(!has(object.spec.securityContext) || !has(object.spec.securityContext.runAsUser)
  || [object.spec.securityContext.runAsUser].all(x, {_IN_RANGE}))
&& object.spec.containers.all(c, !has(c.securityContext) || !has(c.securityContext.runAsUser)
  || [c.securityContext.runAsUser].all(x, {_IN_RANGE}))
&& (!has(object.spec.initContainers) || object.spec.initContainers.all(c,
  !has(c.securityContext) || !has(c.securityContext.runAsUser)
  || [c.securityContext.runAsUser].all(x, {_IN_RANGE})))
"""


@pytest.fixture
def openshift_uid_rule(api: client.ApiClient, namespace: str) -> Iterator[None]:
    """The restricted-v2 user-id rule on this test's namespace alone."""
    admission = client.AdmissionregistrationV1Api(api)
    name = f"scc-uid-range-{namespace}"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": SCC_RULE,
                        "message": "unable to validate against any security context "
                        "constraint: runAsUser: Invalid value: must be in the ranges: "
                        f"[{UID_RANGE[0]}, {UID_RANGE[1]}]",
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    core = client.CoreV1Api(api)
    probe = {
        "metadata": {"name": "probe"},
        "spec": {
            "securityContext": {"runAsUser": 65532},
            "containers": [{"name": "c", "image": "probe"}],
        },
    }

    def enforced() -> bool:  # policies take effect once the API server has loaded them
        try:
            core.create_namespaced_pod(namespace, probe, dry_run="All")
        except client.exceptions.ApiException as error:
            return error.status in (403, 422) and "security context constraint" in error.body
        return False

    wait_for(enforced, what="the admission policy to be enforced")
    yield
    admission.delete_validating_admission_policy_binding(name)
    admission.delete_validating_admission_policy(name)


def rendered(cluster: Cluster, release: str, namespace: str, values: Path, *extra: str) -> str:
    """`helm template` of the chart, as GitOps tools render it for a cluster."""
    result = cluster.run(
        "helm", "template", release, str(CHART), "-n", namespace, "-f", str(values), *extra
    )
    return result.stdout


@pytest.mark.usefixtures("openshift_uid_rule")
def test_on_openshift_no_user_id_is_fixed(
    cluster: Cluster, api: client.ApiClient, namespace: str, nodes: Nodes, tmp_path: Path
) -> None:
    """Rendered for OpenShift (the security.openshift.io API present) the chart fixes no
    runAsUser, so restricted-v2 admits its pods; rendered for plain Kubernetes it fixes
    65532, which restricted-v2 refuses. The operator then makes engine pods without one."""
    nodes.add("cpu")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(values_for(namespace, mode="managed")))
    release = f"cohabit-{namespace.removeprefix('t-')}"
    plain = rendered(cluster, release, namespace, values)
    assert "runAsUser: 65532" in plain
    openshift = rendered(
        cluster, release, namespace, values, "--api-versions", "security.openshift.io/v1"
    )
    assert "runAsUser" not in openshift
    manifest = tmp_path / "openshift.yaml"
    manifest.write_text(openshift)
    cluster.run("kubectl", "apply", "--server-side", "-n", namespace, "-f", str(manifest))
    installed = Release(cluster=cluster, name=release, namespace=namespace)
    try:
        wait_for(lambda: ready(api, installed, "operator"), what="the operator's pod")
        assert not refusals(api, namespace)
        operator = run_operator(installed, tmp_path)
        try:
            node = nodes.recorded("labels_t4.json", "t4")
            apply(api, model_deployment("m", namespace, model="/models/m.gguf", vram="6GiB"))
            status = phase(api, namespace, "m", "DEPLOYED", "FAILED", "ERROR")
            assert (status["phase"], status.get("node")) == ("DEPLOYED", node), status.get(
                "lastErrorMessage"
            )
            pod = client.CoreV1Api(api).read_namespaced_pod("m-engine", namespace)
            assert pod.spec.security_context.run_as_user is None
            assert pod.spec.security_context.run_as_non_root is True
        finally:
            operator.stop()
    finally:
        cluster.run("kubectl", "delete", "--wait=false", "-n", namespace, "-f", str(manifest))
