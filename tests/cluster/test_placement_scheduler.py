"""cohabit's view of a node against the real kube-scheduler's: what one counts, the other
counts, so cohabit refuses up front what the scheduler would refuse and the scheduler binds
what cohabit places; what a managed install cannot see, the scheduler still refuses, and a
managed install writes nothing to nodes.

Layers: the real API server, kube-scheduler (pkg/scheduler/framework/plugins/noderesources/
fit.go sums the requests of the pods bound to a node against its allocatable) and
kube-controller-manager; the chart's operator run here as its ServiceAccount; pods that are
not cohabit's made by hand. kwok plays the kubelets: no container runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cohabit.hardware.model import Topology
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.fleetview import ClusterView, cluster_view
from cohabit.placement.planner import plan
from cohabit.placement.request import PlacementRequest
from cohabit.units import GIB, MIB
from tests.cluster.conftest import Nodes, Operators
from tests.cluster.harness import (
    GROUP_LABEL,
    MANAGED,
    Cluster,
    allowed,
    body,
    bound_node,
    deploy,
    engine_requests,
    host_and,
    no_engine_pod,
    phase,
    plain_pod,
    pod_json,
    refused,
    served_on,
    unschedulable_message,
    values_for,
    wait_for,
)

BUDGET_0 = "cohabit.dev/vram-gb-gpu-0"
MIG_1G = "nvidia.com/mig-1g.10gb"
# kube-controller-manager's TTL controller annotates every node soon after it registers
# (pkg/controller/ttl/ttl_controller.go); a node is settled once it has.
TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"
HOSTNAME = "kubernetes.io/hostname"


def live_view(api: client.ApiClient, namespace: str, topology: Topology) -> ClusterView:
    """`cluster_view()` over the live nodes and pods, read as the operator reads them: the
    test's nodes (the chart's placement.nodeSelector) and every namespace's pods."""
    port = KubernetesPort(api, node_selector=f"{GROUP_LABEL}={namespace}")
    return cluster_view(port.list_nodes(), port.list_pods(None), topology=topology)


def free_on(view: ClusterView, node: str, gpu: int) -> int:
    """The free budget of one GPU in the view (bytes)."""
    for slot, free in zip(view.state.slots, view.state.free_bytes(), strict=True):
        if (slot.node, slot.gpu_index) == (node, gpu):
            return free
    raise AssertionError(f"no gpu {gpu} on {node} in the view")


def scheduler_binds(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Wait for the scheduler's verdict on a pod: bound (True) or Unschedulable (False)."""

    def verdict() -> str:
        pod = pod_json(api, namespace, name)
        if pod["spec"].get("nodeName"):
            return "bound"
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("reason") == (
                "Unschedulable"
            ):
                return "refused"
        return ""

    return wait_for(verdict, what=f"the scheduler's verdict on {name}") == "bound"


def delete_pod(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete a pod and wait until it is gone (kwok finishes graceful deletion)."""
    core = client.CoreV1Api(api)
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    wait_for(gone, what=f"pod {name} to be gone")


def failed_scheduling(api: client.ApiClient, namespace: str, name: str) -> str:
    """Wait for the scheduler's FailedScheduling event on a pod; its message."""
    core = client.CoreV1Api(api)

    def event() -> str:
        found = core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},reason=FailedScheduling"
        )
        return next((str(e.message) for e in found.items if e.message), "")

    return wait_for(event, what=f"a FailedScheduling event for {name}")


def test_the_scheduler_enforces_budgets_and_cohabit_counts_what_it_bound(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """A 15 GiB T4 budget. Someone else's pod holding 10 GiB is bound and counted by both;
    one asking 16 GiB stays Pending with the scheduler's reason and holds nothing in
    either view. At the edge (5 GiB fits, 6 does not) cohabit's plan and the scheduler
    agree; cohabit refuses 6 GiB itself, before any pod, and places it once the other pod
    has gone."""
    node = nodes.recorded("labels_t4_standalone.json", "t4")
    operators.start(values_for(namespace, placement={"retrySeconds": 1}))
    core = client.CoreV1Api(api)
    for name, gib in (("other-10", "10"), ("other-16", "16")):
        pod = plain_pod(name, namespace, hostname=node, resources={BUDGET_0: gib})
        core.create_namespaced_pod(namespace, pod)
    assert bound_node(api, namespace, "other-10") == node
    assert f"1 Insufficient {BUDGET_0}" in unschedulable_message(api, namespace, "other-16")
    assert f"Insufficient {BUDGET_0}" in failed_scheduling(api, namespace, "other-16")
    assert pod_json(api, namespace, "other-16")["status"]["phase"] == "Pending"

    view = live_view(api, namespace, Topology.STANDALONE_CLUSTER)
    assert free_on(view, node, 0) == 5 * GIB  # 15 - 10: the bound pod; the pending one not
    for gib in (5, 6):
        request = PlacementRequest(name=f"{namespace}/p", vram_bytes=gib * GIB, engine="llamacpp")
        name = f"probe-{gib}"
        core.create_namespaced_pod(
            namespace, plain_pod(name, namespace, hostname=node, resources={BUDGET_0: str(gib)})
        )
        assert scheduler_binds(api, namespace, name) is plan(view.state, request).placed, gib
        delete_pod(api, namespace, name)

    status = deploy(api, namespace, "six", vram="6GiB")
    assert refused(status, "insufficient_capacity", permanent=False) == (
        f"0/1 nodes fit: 1 insufficient GPU memory (largest free 5 GiB on {node} gpu 0)"
    )
    assert no_engine_pod(api, namespace, "six")
    delete_pod(api, namespace, "other-10")
    status = phase(api, namespace, "six", "DEPLOYED")
    assert served_on(api, namespace, "six") == node
    assert engine_requests(api, namespace, "six") == host_and({BUDGET_0: "6"})


def test_a_slice_someone_else_holds_is_not_offered(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Managed H100 (MIG mixed, two 1g.10gb): a pod of the release namespace that is not
    cohabit's holds one 1g.10gb. cohabit counts it, so the first 9 GiB model takes the
    other and the second the 2g.20gb; the scheduler then has no 1g.10gb left either."""
    node = nodes.recorded("labels_mig_mixed.json", "h100")
    operators.start(values_for(namespace, **MANAGED))
    core = client.CoreV1Api(api)
    pod = plain_pod("other-slice", namespace, hostname=node, resources={MIG_1G: "1"})
    core.create_namespaced_pod(namespace, pod)
    assert bound_node(api, namespace, "other-slice") == node
    view = live_view(api, namespace, Topology.MANAGED_CLUSTER)
    held = {key: size for key, size in view.state.used_bytes().items() if key[0] == node}
    assert list(held.values()) == [9856 * MIB]  # one 1g.10gb slice, whole

    for name, profile in (("a", "1g.10gb"), ("b", "2g.20gb")):
        status = deploy(api, namespace, name, vram="9GiB")
        assert (status["phase"], status.get("partition")) == ("DEPLOYED", profile), status
        assert served_on(api, namespace, name) == node
    pod = plain_pod("another-slice", namespace, hostname=node, resources={MIG_1G: "1"})
    core.create_namespaced_pod(namespace, pod)
    assert f"1 Insufficient {MIG_1G}" in unschedulable_message(api, namespace, "another-slice")


def test_what_a_managed_install_cannot_see_the_scheduler_refuses(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    tenant_namespace: str,
    nodes: Nodes,
    operators: Operators,
    tmp_path: Path,
) -> None:
    """Managed RBAC lets the operator list pods in its own namespace only, so another
    tenant's pod holding both 1g.10gb slices is invisible to it: it places a 9 GiB model on
    a 1g.10gb, the scheduler refuses the pod, and the operator records the scheduler's
    reason and deletes the pod, leaving nothing pending."""
    node = nodes.recorded("labels_mig_mixed.json", "h100")
    release = operators.start(values_for(namespace, **MANAGED))
    account = release.kubeconfig("Deployment", "operator", tmp_path)
    assert allowed(cluster, account, "list", "pods", namespace)
    assert not allowed(cluster, account, "list", "pods", tenant_namespace)
    core = client.CoreV1Api(api)
    pod = plain_pod("tenant-slices", tenant_namespace, hostname=node, resources={MIG_1G: "2"})
    core.create_namespaced_pod(tenant_namespace, pod)
    assert bound_node(api, tenant_namespace, "tenant-slices") == node

    status = deploy(api, namespace, "m", vram="9GiB")
    assert status["phase"] == "FAILED", status
    assert status["lastErrorCode"] == "NoFitError"
    message = status["lastErrorMessage"]
    assert message.startswith("insufficient_capacity: 0/"), message
    assert f"Insufficient {MIG_1G}" in message
    wait_for(lambda: no_engine_pod(api, namespace, "m"), what="the refused pod to be deleted")


def node_facts(api: client.ApiClient, name: str) -> dict[str, Any]:
    """What a write to a node would change: labels, annotations, taints, capacity and
    allocatable, and the field managers that ever wrote it (metadata.managedFields)."""
    node = body(client.CoreV1Api(api).read_node(name, _preload_content=False))
    meta, status = node["metadata"], node["status"]
    managed = meta.get("managedFields") or []
    return {
        "labels": meta.get("labels"),
        "annotations": meta.get("annotations"),
        "taints": (node.get("spec") or {}).get("taints"),
        "capacity": status.get("capacity"),
        "allocatable": status.get("allocatable"),
        "managers": sorted(
            {(f["manager"], f["operation"], f.get("subresource", "")) for f in managed}
        ),
    }


def test_a_managed_install_writes_nothing_to_nodes(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    tmp_path: Path,
) -> None:
    """mode: managed on a GPU Operator T4 without sharing: the first model takes the card
    whole with the SharingNotConfigured notice, pinned by the node's hostname label, and
    the second is refused for it. The node is as
    it was (no field, no field manager of ours), and RBAC would refuse any write."""
    # As on EKS, the hostname label is not the node's name; the pod is pinned by the label.
    hostname = f"ip-10-0-3-17-{namespace}"
    node = nodes.recorded("labels_t4.json", "t4", labels={HOSTNAME: hostname})
    wait_for(
        lambda: TTL_ANNOTATION in (node_facts(api, node)["annotations"] or {}),
        what="kube-controller-manager to settle the node",
    )
    before = node_facts(api, node)
    release = operators.start(values_for(namespace, **MANAGED))
    account = release.kubeconfig("Deployment", "operator", tmp_path)
    assert allowed(cluster, account, "list", "nodes")  # the check can say yes
    for verb in ("patch", "update", "create", "delete"):
        assert not allowed(cluster, account, verb, "nodes"), verb

    status = deploy(api, namespace, "first", vram="6GiB")
    assert status["phase"] == "DEPLOYED", status
    assert (status["sharingClass"], status["notices"]) == ("whole_gpu", ["SharingNotConfigured"])
    assert engine_requests(api, namespace, "first") == host_and({"nvidia.com/gpu": "1"})
    assert served_on(api, namespace, "first") == node
    (term,) = pod_json(api, namespace, "first-engine")["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": HOSTNAME, "operator": "In", "values": [hostname]}]
    status = deploy(api, namespace, "second", vram="6GiB")
    message = refused(status, "sharing_not_configured", permanent=False)
    assert message == "0/1 nodes fit: 1 sharing not configured"
    assert no_engine_pod(api, namespace, "second")
    assert node_facts(api, node) == before
    (log,) = (process.output() for process in operators.running)
    assert " 403" not in log


@pytest.mark.parametrize(
    ("fixture", "changes", "second", "probe"),
    [
        pytest.param(
            # Two L4 cards, one unhealthy: allocatable nvidia.com/gpu 1, GFD's count 2.
            "labels_l4x2_one_unhealthy.json", {}, None, "nvidia.com/gpu",
            id="l4-card-unhealthy",
        ),
        pytest.param(
            # One of the two 1g.10gb slices unhealthy (capacity 2, allocatable 1).
            "labels_mig_mixed.json",
            {"capacity": {MIG_1G: "2"}, "allocatable": {MIG_1G: "1"}},
            "2g.20gb", MIG_1G,
            id="mig-slice-unhealthy",
        ),
    ],
)  # fmt: skip
def test_a_device_the_plugin_marked_unhealthy_is_not_offered(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    fixture: str,
    changes: dict[str, dict[str, str]],
    second: str | None,
    probe: str,
) -> None:
    """Managed: the kubelet's allocatable leaves out the devices the vendor's plugin marked
    unhealthy, the labels do not. The one healthy device of its kind takes the first model;
    the second goes to the next size up, or is refused by cohabit before any pod, and the
    scheduler has nothing of that kind left either."""
    node = nodes.recorded(fixture, "gpu", **changes)
    operators.start(values_for(namespace, **MANAGED))
    status = deploy(api, namespace, "first", vram="9GiB")
    assert status["phase"] == "DEPLOYED", status
    assert served_on(api, namespace, "first") == node
    status = deploy(api, namespace, "second", vram="9GiB")
    if second is None:
        assert refused(status, "sharing_not_configured", permanent=False) == (
            "0/1 nodes fit: 1 sharing not configured"
        )
        assert no_engine_pod(api, namespace, "second")
    else:
        assert (status["phase"], status.get("partition")) == ("DEPLOYED", second), status
        assert served_on(api, namespace, "second") == node
    pod = plain_pod("probe", namespace, hostname=node, resources={probe: "1"})
    client.CoreV1Api(api).create_namespaced_pod(namespace, pod)
    assert f"1 Insufficient {probe}" in unschedulable_message(api, namespace, "probe")


def test_init_containers_and_sidecars_hold_what_the_scheduler_counts(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Someone else's pod on the 15 GiB T4: a sidecar (restartable init container) of 2
    GiB, then a one-shot init container of 10 GiB, and a 1 GiB container. The scheduler
    counts max(1 + 2, 10 + 2) = 12 GiB for as long as the pod is bound
    (component-helpers resource.PodRequests), so 3 GiB are free in both views."""
    node = nodes.recorded("labels_t4_standalone.json", "t4")
    operators.start(values_for(namespace))
    pod = plain_pod("other", namespace, hostname=node, resources={BUDGET_0: "1"})
    main = pod["spec"]["containers"][0]
    pod["spec"]["initContainers"] = [
        {**main, "name": "sidecar", "restartPolicy": "Always",
         "resources": {"requests": {BUDGET_0: "2"}, "limits": {BUDGET_0: "2"}}},
        {**main, "name": "warm-up",
         "resources": {"requests": {BUDGET_0: "10"}, "limits": {BUDGET_0: "10"}}},
    ]  # fmt: skip
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, pod)
    assert bound_node(api, namespace, "other") == node
    view = live_view(api, namespace, Topology.STANDALONE_CLUSTER)
    assert free_on(view, node, 0) == 3 * GIB
    for gib, binds in ((4, False), (3, True)):
        name = f"probe-{gib}"
        core.create_namespaced_pod(
            namespace, plain_pod(name, namespace, hostname=node, resources={BUDGET_0: str(gib)})
        )
        assert scheduler_binds(api, namespace, name) is binds, gib
        delete_pod(api, namespace, name)
    status = deploy(api, namespace, "four", vram="4GiB")
    assert refused(status, "insufficient_capacity", permanent=False) == (
        f"0/1 nodes fit: 1 insufficient GPU memory (largest free 3 GiB on {node} gpu 0)"
    )


def test_host_cpu_the_plan_does_not_count_is_refused_by_the_scheduler(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Each engine pod also asks for the chart's host CPU (1 core) and the T4 box
    allocates 3.92 cores: three 3 GiB models fit, a fourth fits the 15 GiB budget but not
    the CPU. cohabit plans GPU memory only, so the scheduler refuses that pod; the operator
    records the scheduler's words as a NoFit and deletes the pod, leaving nothing pending."""
    node = nodes.recorded("labels_t4_standalone.json", "t4")
    operators.start(values_for(namespace))
    for name in ("a", "b", "c"):
        assert deploy(api, namespace, name, vram="3GiB")["phase"] == "DEPLOYED"
        assert served_on(api, namespace, name) == node
    status = deploy(api, namespace, "d", vram="3GiB")
    assert (status["phase"], status["lastErrorCode"]) == ("FAILED", "NoFitError"), status
    message = status["lastErrorMessage"]
    assert message.startswith("insufficient_capacity: 0/"), message
    assert "1 Insufficient cpu" in message, message
    wait_for(lambda: no_engine_pod(api, namespace, "d"), what="the refused pod to be deleted")
