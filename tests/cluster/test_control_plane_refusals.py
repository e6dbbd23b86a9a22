"""What the real API server refuses, and where the control plane says so: a call refused by
RBAC (403) or an admission policy (422), the control plane's own or the operator's, ends the
deployment with the server's words; `cohabit serve --backend kubernetes` refuses to start,
in one line, without PostgreSQL, a cluster, or the right to read it; and the chart's API
Deployment asks for what the runtime uses, and in managed mode no more."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kamiwaza_sdk.exceptions import DeploymentFailedError
from kubernetes import client

from cohabit.kube import crd
from cohabit.kube.runtime import md_name
from cohabit.units import GIB
from tests.cluster.conftest import Nodes, Releases
from tests.cluster.controlplane import (
    Chart,
    install_with_api,
    pods,
    sdk,
)
from tests.cluster.harness import (
    WAIT_S,
    Cluster,
    Release,
    allowed,
    free_port,
    token_kubeconfig,
    unique,
    wait_for,
)
from tests.service.test_sdk import register

WAIT = {"poll_interval_seconds": 0.1, "timeout_seconds": int(WAIT_S)}


@pytest.fixture
def policies(api: client.ApiClient) -> Iterator[list[str]]:
    """ValidatingAdmissionPolicies (and their bindings, of the same name) the test made;
    deleted afterwards: they are cluster-wide."""
    made: list[str] = []
    yield made
    admission = client.AdmissionregistrationV1Api(api)
    for name in made:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def forbid(cluster: Cluster, release: Release, resource: str, verb: str, folder: Path) -> None:
    """Take `verb` on `resource` away from the chart's ClusterRole, as an administrator
    trimming it would; returns once the authorizer refuses it (RBAC reads roles from an
    informer, so the change is not instant)."""
    rbac = client.RbacAuthorizationV1Api(cluster.api())
    role = rbac.read_cluster_role(f"{release.name}-operator")
    for rule in role.rules:
        if resource in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != verb]
    rbac.replace_cluster_role(role.metadata.name, role)
    kubeconfig = release.kubeconfig("Deployment", "api", folder)
    wait_for(
        lambda: not allowed(cluster, kubeconfig, verb, resource, release.namespace),
        what=f"the chart's account to lose {verb} {resource}",
    )


def deny(
    api: client.ApiClient,
    namespace: str,
    policies: list[str],
    *,
    resource: tuple[str, str, str],
    expression: str,
    message: str,
    probe: dict[str, object],
) -> None:
    """A ValidatingAdmissionPolicy refusing CREATE of `resource` (group, version, plural)
    in `namespace` unless `expression` holds; denied with reason Invalid, so 422
    (k8s.io/apiserver pkg/admission/plugin/policy/validating dispatcher.go,
    policy_decision.go reasonToCode). Returns once a dry run of `probe` is refused:
    policies are loaded asynchronously."""
    group, version, plural = resource
    name = unique("cohabit-test")
    admission = client.AdmissionregistrationV1Api(api)
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [group],
                            "apiVersions": [version],
                            "operations": ["CREATE"],
                            "resources": [plural],
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message}],
            },
        }
    )
    policies.append(name)
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

    def refused() -> bool:
        try:
            if group:
                client.CustomObjectsApi(api).create_namespaced_custom_object(
                    group, version, namespace, plural, probe, dry_run="All"
                )
            else:
                client.CoreV1Api(api).create_namespaced_pod(namespace, probe, dry_run="All")
        except client.exceptions.ApiException as error:
            if error.status == 422 and message in (error.body or ""):
                return True
            raise
        return False

    wait_for(refused, what=f"policy {name} to refuse {plural}")


POD_PROBE = {
    "metadata": {"name": "probe"},
    "spec": {"containers": [{"name": "c", "image": "ghcr.io/probe"}]},
}
MD_PROBE = {
    "apiVersion": crd.API_VERSION,
    "kind": crd.KIND,
    "metadata": {"name": "probe"},
    "spec": {"model": "/tmp/probe.gguf", "engine": "llamacpp"},
}


@pytest.mark.parametrize(
    "refusal",
    ["control-plane-403", "operator-403", "control-plane-422", "operator-422"],
)
def test_what_the_api_server_refuses_is_the_deployments_last_error(
    api: client.ApiClient,
    cluster: Cluster,
    namespace: str,
    chart: Chart,
    policies: list[str],
    tmp_path: Path,
    refusal: str,
) -> None:
    """A call refused by RBAC (403) or by an admission policy (422), whether the control
    plane's own (create the ModelDeployment) or the operator's (create the pod), ends the
    deployment with the server's words in last_error_message, and a time; not a log line
    alone. No pod is left."""
    server = chart.api
    release = chart.release
    if refusal == "control-plane-403":
        forbid(cluster, release, "modeldeployments", "create", tmp_path)
        words = f'cannot create resource "modeldeployments" in API group "{crd.GROUP}"'
    elif refusal == "operator-403":
        forbid(cluster, release, "pods", "create", tmp_path)
        words = 'cannot create resource "pods" in API group ""'
    elif refusal == "control-plane-422":
        words = "models are served from /models only"
        deny(
            api,
            namespace,
            policies,
            resource=(crd.GROUP, crd.VERSION, crd.PLURAL),
            expression="object.spec.model.startsWith('/models/')",
            message=words,
            probe=MD_PROBE,
        )
    else:
        words = "engine images come from the local registry"
        deny(
            api,
            namespace,
            policies,
            resource=("", "v1", "pods"),
            expression="object.spec.containers.all(c, !c.image.startsWith('ghcr.io/'))",
            message=words,
            probe=POD_PROBE,
        )
    user = sdk(server.url)
    model = register(user, tmp_path, "model-a")
    with pytest.raises(DeploymentFailedError) as failed:
        user.serving.deploy_model(model_id=model, vram_allocation=6 * GIB, **WAIT)
    record = user.get(f"/serving/deployment/{failed.value.deployment_id}")
    assert record["last_error_code"] == "RUNTIME_ERROR", record
    assert words in record["last_error_message"], record
    status = "403 Forbidden" if refusal.endswith("403") else "422 Unprocessable Entity"
    assert status in record["last_error_message"], record
    if refusal.startswith("operator"):
        assert record["last_error_message"].startswith("KubernetesAPIError: create pods")
    assert record["last_error_at"] is not None
    assert not [
        p for p in pods(api, namespace) if p.startswith(md_name(str(failed.value.deployment_id)))
    ]


# --- the command refuses to start ------------------------------------------------------------


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment less every COHABIT_ and KUBERNETES_ variable (a pod's in-cluster
    config), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COHABIT_", "KUBERNETES_"))}
    return {**env, "COHABIT_DATA_DIR": str(tmp_path / "data"), **extra}


def closed_kubeconfig(path: Path) -> Path:
    """A kubeconfig naming a loopback port nobody listens on: a cluster that is down."""
    server = f"https://127.0.0.1:{free_port()}"
    path.write_text(
        f"""apiVersion: v1
kind: Config
current-context: down
clusters: [{{name: down, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: down, user: {{token: t}}}}]
contexts: [{{name: down, context: {{cluster: down, user: down}}}}]
"""
    )
    return path


POSTGRES_NOT_OPENED = "postgresql+psycopg://u@127.0.0.1:1/x"  # refused before it is opened


@pytest.mark.parametrize(
    ("database_url", "config", "code", "message"),
    [
        pytest.param(None, None, 2, "--backend kubernetes stores deployments in PostgreSQL",
                     id="no-database-url"),
        pytest.param("sqlite:////tmp/x.db", None, 2, "set COHABIT_DATABASE_URL to a postgresql",
                     id="sqlite-refused"),
        pytest.param(POSTGRES_NOT_OPENED, "missing", 1,
                     "Kubernetes: no Kubernetes cluster configured", id="no-kubeconfig"),
        pytest.param(POSTGRES_NOT_OPENED, "closed", 1,
                     "Kubernetes: list nodes: cannot reach the Kubernetes API server",
                     id="cluster-down"),
        pytest.param(POSTGRES_NOT_OPENED, "no-rbac", 1,
                     'Kubernetes: list nodes: 403 Forbidden: nodes is forbidden: User '
                     '"system:serviceaccount:{namespace}:default" cannot list resource "nodes"',
                     id="not-allowed-to-read-nodes"),
    ],
)  # fmt: skip
def test_serve_refuses_without_postgresql_a_cluster_or_the_right_to_read_it(
    cluster: Cluster,
    namespace: str,
    tmp_path: Path,
    database_url: str | None,
    config: str | None,
    code: int,
    message: str,
) -> None:
    """One line saying why, no traceback. The last case runs as a ServiceAccount the chart
    did not make (its namespace's default, with no role): the API server's own words."""
    extra = {"COHABIT_DATABASE_URL": database_url} if database_url else {}
    if config == "missing":
        extra["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    elif config == "closed":
        extra["KUBECONFIG"] = str(closed_kubeconfig(tmp_path / "kubeconfig"))
    elif config == "no-rbac":
        kubeconfig = token_kubeconfig(cluster, namespace, "default", tmp_path / "kubeconfig")
        extra["KUBECONFIG"] = str(kubeconfig)
    command = [sys.executable, "-m", "cohabit", "serve", "--backend", "kubernetes"]
    result = subprocess.run(
        [*command, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=serve_env(tmp_path, **extra),
    )
    assert result.returncode == code, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the no-token notice, if any
    assert last.startswith("error: "), result.stderr
    assert message.format(namespace=namespace) in last, result.stderr
    assert "Traceback" not in result.stderr


# --- the chart's API Deployment ----------------------------------------------------------------

RUNTIME_NEEDS = [
    *(("modeldeployments", verb) for verb in ("create", "get", "list", "patch", "delete")),
    ("modeldeployments/status", "patch"),
    ("pods", "list"),
    ("pods/log", "get"),
]


@pytest.mark.parametrize("mode", ["standalone", "managed"])
def test_the_chart_runs_the_api_with_what_the_runtime_needs(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    tmp_path: Path,
    mode: str,
) -> None:
    """Installed: its pod admitted, scheduled on the chart's nodes and Ready; its command
    the kubernetes backend, its PostgreSQL URL and token from the Secrets, its probe a real
    route; its ServiceAccount may do what the runtime does, and reads other namespaces' pods
    (whose budgets count) only on a standalone cluster."""
    nodes.add("cpu")
    release = install_with_api(releases, cluster, POSTGRES_NOT_OPENED, mode=mode)
    apps = client.AppsV1Api(api)
    wait_for(
        lambda: (
            apps.read_namespaced_deployment(f"{release.name}-api", namespace).status.ready_replicas
            == 1
        ),
        what="the API Deployment's pod to be admitted, scheduled and Ready",
    )
    container = release.container("Deployment", "api")
    assert container["command"][:4] == ["cohabit", "serve", "--backend", "kubernetes"]
    env = {e["name"]: e for e in container["env"]}
    assert env["COHABIT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert env["COHABIT_API_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert container["readinessProbe"]["httpGet"]["path"] == "/api/serving/health"

    kubeconfig = release.kubeconfig("Deployment", "api", tmp_path)
    refused = [
        f"{verb} {resource}"
        for resource, verb in RUNTIME_NEEDS
        if not allowed(cluster, kubeconfig, verb, resource, namespace)
    ]
    assert refused == []
    assert allowed(cluster, kubeconfig, "list", "nodes")
    assert allowed(cluster, kubeconfig, "list", "pods", "kube-system") == (mode == "standalone")
