"""What a real API server refuses of the operator's writes, and where the refusal goes: a
compute ResourceQuota, Pod Security `restricted`, RBAC (with the admission plugin
OwnerReferencesPermissionEnforcement on), pod validation. Each refusal reaches the
ModelDeployment's status in the server's own words (FAILED, KubernetesAPIError), never only a
log line, and is tried again, so the deployment is placed once an administrator fixes the
cause.

The chart's operator runs here as its ServiceAccount, or as one bound to less (harness.py);
kwok plays the kubelets (no container runs). Admission happens before any kubelet sees a pod,
so everything refused here is refused as on any cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.utils import parse_quantity

from cohabit.kube import crd
from tests.cluster.conftest import ClusterRbac, Nodes, Operators, Releases
from tests.cluster.harness import (
    SETTLED,
    Cluster,
    apply,
    delete_model_deployment,
    deploy,
    enforce_pod_security,
    engine_pod,
    get_model_deployment,
    model_deployment,
    no_engine_pod,
    phase,
    set_quota,
    token_kubeconfig,
    values_for,
    wait_for,
)

T4 = "labels_t4_standalone.json"  # our agent's labels and one 15 GiB budget
RETRY = {"placement": {"retrySeconds": 2}}  # what an administrator fixes is seen soon
HF = {"repo": "Qwen/Qwen3-0.6B-GGUF", "file": "Qwen3-0.6B-Q8_0.gguf"}


def refusal(status: dict[str, Any]) -> str:
    """The refusal recorded on a status (asserting it is one)."""
    assert (status["phase"], status.get("lastErrorCode")) == ("FAILED", crd.API_ERROR), status
    return str(status["lastErrorMessage"])


def test_engine_pods_are_admitted_under_a_compute_quota(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: resources.container_resources with the chart's engines.resources. A quota on
    cpu or memory makes the quota plugin refuse a pod that does not ask for them ("must
    specify limits.memory, requests.cpu, requests.memory", kubernetes pkg/quota/v1/
    evaluator/core/pods.go): engine pods asked only for their devices."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    set_quota(
        api, namespace, {"requests.cpu": "8", "requests.memory": "32Gi", "limits.memory": "128Gi"}
    )
    before = memory_used(api, namespace)
    assert deploy(api, namespace, "chat", vram="6GiB")["phase"] == "DEPLOYED"
    # The quota plugin charges what it admits at once: the engine's 4Gi request is counted.
    assert memory_used(api, namespace) - before == 4 * 2**30


def memory_used(api: client.ApiClient, namespace: str) -> int:
    used = client.CoreV1Api(api).read_namespaced_resource_quota("compute", namespace).status.used
    return int(parse_quantity(used["requests.memory"]))


def test_a_quota_too_small_is_recorded_and_the_retry_places_it_once_raised(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: controller.reconcile recording a refused create (403 `exceeded quota`) with
    the server's words, and the operator's Retrier trying it again."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace, **RETRY))
    small = {"requests.cpu": "8", "requests.memory": "3Gi", "limits.memory": "128Gi"}
    set_quota(api, namespace, small)  # the engine asks for 4Gi
    message = refusal(deploy(api, namespace, "chat", vram="6GiB"))
    assert message.startswith(f"create pods {namespace}/chat-engine: 403 Forbidden: "), message
    assert "exceeded quota: compute, requested: requests.memory=4Gi" in message
    assert no_engine_pod(api, namespace, "chat")

    set_quota(api, namespace, {**small, "requests.memory": "32Gi"})
    placed = phase(api, namespace, "chat", "DEPLOYED")
    assert "lastErrorCode" not in placed


def test_engine_pods_are_admitted_where_pod_security_is_restricted(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: resources.pod_security and CONTAINER_SECURITY against the PodSecurity admission
    plugin's `restricted` profile (k8s.io/pod-security-admission policy/check_*.go): the
    engine and its download init container pass; a hostPath model volume is refused
    (check_restrictedVolumes.go), and the refusal reaches the status."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    enforce_pod_security(api, namespace, "restricted")
    apply(
        api,
        model_deployment(
            "chat", namespace, model=HF["repo"], vram="2GiB", storage={"huggingFace": HF}
        ),
    )
    assert phase(api, namespace, "chat", *SETTLED)["phase"] == "DEPLOYED"
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None and [c["name"] for c in pod["spec"]["initContainers"]] == ["download"]

    storage = {"hostPath": {"path": "/srv/models"}}
    message = refusal(deploy(api, namespace, "local", vram="2GiB", storage=storage))
    assert message.startswith(f"create pods {namespace}/local-engine: 403 Forbidden: "), message
    assert 'violates PodSecurity "restricted:latest": restricted volume types' in message
    assert 'volume "models" uses restricted volume type "hostPath"' in message
    assert no_engine_pod(api, namespace, "local")


def test_owner_references_need_the_finalizers_rule_and_its_refusal_reaches_the_status(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    operators: Operators,
    cluster_rbac: ClusterRbac,
    tmp_path: Path,
) -> None:
    """Layer: the chart's RBAC (modeldeployments/finalizers: update) under the
    OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift, and here:
    kubernetes plugin/pkg/admission/gc/gc_admission.go), and controller.reconcile recording
    what the server refused. The operator runs as a ServiceAccount bound to the chart's
    rules minus that one: blockOwnerDeletion on the Service (applied first) is refused with
    403 and the status says so; once an administrator grants the rule the retry places it,
    with the owner references the garbage collector then follows when the deployment goes."""
    nodes.recorded(T4, "t4")
    release = releases.install(values_for(namespace, **RETRY))
    rbac = client.RbacAuthorizationV1Api(api)
    chart = rbac.read_cluster_role(f"{release.name}-operator")
    rules = [api.sanitize_for_serialization(rule) for rule in chart.rules]
    without = [rule for rule in rules if "modeldeployments/finalizers" not in rule["resources"]]
    assert len(without) == len(rules) - 1
    account = (namespace, "without-finalizers")
    client.CoreV1Api(api).create_namespaced_service_account(
        namespace, {"metadata": {"name": account[1]}}
    )
    prefix = f"{namespace}-without-finalizers"
    cluster_rbac.bind(f"{prefix}-nodes", None, f"{release.name}-nodes-read", account)
    cluster_rbac.bind(prefix, without, prefix, account)
    kubeconfig = token_kubeconfig(cluster, namespace, account[1], tmp_path / "without.kubeconfig")
    operators.run(release, kubeconfig=kubeconfig)

    message = refusal(deploy(api, namespace, "chat", vram="6GiB"))
    assert message.startswith(f"apply services {namespace}/chat: 403 Forbidden: "), message
    assert (
        "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set "
        "finalizers on"
    ) in message
    assert no_engine_pod(api, namespace, "chat")

    finalizers = [rule for rule in rules if "modeldeployments/finalizers" in rule["resources"]]
    cluster_rbac.bind(f"{prefix}-granted", finalizers, f"{prefix}-granted", account)
    assert phase(api, namespace, "chat", "DEPLOYED")
    found = get_model_deployment(api, namespace, "chat")
    assert found is not None
    owner = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "name": "chat",
        "uid": found["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    core = client.CoreV1Api(api)
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None and pod["metadata"]["ownerReferences"] == [owner]
    service = api.sanitize_for_serialization(core.read_namespaced_service("chat", namespace))
    assert service["metadata"]["ownerReferences"] == [owner]

    delete_model_deployment(api, namespace, "chat")
    wait_for(lambda: engine_pod(api, namespace, "chat") is None, what="the pod collected")
    wait_for(
        lambda: not [s for s in core.list_namespaced_service(namespace).items
                     if s.metadata.name == "chat"],
        what="the Service collected",
    )  # fmt: skip


def test_a_pod_the_api_server_finds_invalid_is_recorded_with_its_words(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: controller.reconcile recording a 422. A Secret's name must be a DNS-1123
    subdomain (kubernetes pkg/apis/core/validation: validateSecretKeySelector), which the
    CRD's schema does not check: the pod is refused, and the status names the field."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    storage = {"huggingFace": {**HF, "tokenSecret": {"name": "HF_Token"}}}
    apply(api, model_deployment("chat", namespace, model=HF["repo"], vram="2GiB", storage=storage))
    message = refusal(phase(api, namespace, "chat", *SETTLED))
    assert message.startswith(f"create pods {namespace}/chat-engine: 422 Unprocessable Entity: "), (
        message
    )
    assert "secretKeyRef.name" in message and "HF_Token" in message
    assert no_engine_pod(api, namespace, "chat")
