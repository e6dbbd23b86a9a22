"""The placement operator's loop on a real control plane: the chart installed with helm, its
operator run here as the chart's ServiceAccount (harness.py), ModelDeployments created as a
user creates them, pods bound by the real kube-scheduler, which enforces the budgets the
nodes' allocatable publishes.

kwok plays the kubelets: a bound pod is reported Running and Ready at once and no container
runs, so where a test needs an engine still starting it writes the pod's status as a kubelet
would. Nodes are the recorded label fixtures (one T4 as our agent or the GPU operator
labels it); the GPUs are never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import controller
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import OperatorSettings, Retry
from cohabit.kube.operator import settings_from_env
from cohabit.kube.startqueue import START_GATE
from tests.cluster.conftest import Nodes, Operators
from tests.cluster.harness import (
    GROUP_LABEL,
    Cluster,
    allowed,
    bound,
    container_env,
    delete_model_deployment,
    deploy,
    engine_pod,
    get_model_deployment,
    patch_model_deployment,
    phase,
    pods,
    ready_reason,
    requests_of,
    status_of,
    unique,
    wait_for,
)

T4 = "labels_t4_standalone.json"  # our agent's labels and one 15 GiB budget
MANAGED_T4 = "labels_t4.json"  # the GPU operator's, no sharing configured: nvidia.com/gpu 1
SETTLED = ("DEPLOYED", "FAILED", "ERROR")
HOST = {"cpu": "1", "memory": "4Gi"}  # the chart's engines.resources requests
HOST_LIMITS = {"memory": "32Gi"}


def scheduled_by_the_scheduler(api: client.ApiClient, namespace: str, pod: str) -> str:
    """The kube-scheduler's own record of binding the pod: its `Scheduled` event."""
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}"
    )
    return " ".join(e.message for e in events.items if e.reason == "Scheduled")


def test_two_models_share_one_gpu_budget_and_a_third_fails_fast_with_no_pod(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    node = nodes.recorded(T4, "t4")
    _, operator = operators.start()
    deploy(api, namespace, "model-a", model="/models/a.gguf", vram="6GiB")
    deploy(api, namespace, "model-b", model="/models/b.gguf", vram="6GiB")
    for name in ("model-a", "model-b"):
        placed = phase(api, namespace, name, *SETTLED)
        assert placed["phase"] == "DEPLOYED", placed
        assert ready_reason(placed) == "Ready"
        assert (placed["node"], placed["gpuIndices"], placed["allocatedCapacityGb"]) == (
            node,
            [0],
            6,
        )
        assert (placed["hardwareClass"], placed["sharingClass"]) == (
            "software_shared",
            "fractional",
        )
    deploy(api, namespace, "model-c", model="/models/c.gguf", vram="6GiB")
    refused = phase(api, namespace, "model-c", *SETTLED)

    assert refused["lastErrorCode"] == "NoFitError"
    assert refused["lastErrorMessage"] == (
        "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
        f"(largest free 3 GiB on {node} gpu 0)"
    )
    assert refused["noFit"]["requestedBytes"] == 6 << 30
    assert refused["lastErrorAt"].endswith("Z")
    engines = {name: pod for name, pod in pods(api, namespace).items() if "-engine" in name}
    assert sorted(engines) == ["model-a-engine", "model-b-engine"]
    for name, pod in engines.items():
        budget = {"cohabit.dev/vram-gb-gpu-0": "6"}
        assert requests_of(pod) == {**HOST, **budget}
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {**HOST_LIMITS, **budget}
        assert bound(pod) == node
        # Created without spec.nodeName: the scheduler, checking the budget, bound it.
        message = wait_for(
            lambda n=name: scheduled_by_the_scheduler(api, namespace, n),
            what=f"the scheduler's Scheduled event for {name}",
        )
        assert f"to {node}" in message
    # The operator's log says what its handlers did (kopf's INFO records, as `kopf run`).
    wait_for(
        lambda: (
            f"[{namespace}/model-c] Handler 'register.<locals>.deploy' succeeded."
            in operator.output()
        ),
        what="the operator's log to record its handler",
    )


def test_a_stopped_deployment_frees_its_budget_for_one_waiting(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    nodes.recorded(T4, "t4")
    operators.start()
    deploy(api, namespace, "big", model="/models/big.gguf", vram="12GiB")
    assert phase(api, namespace, "big", *SETTLED)["phase"] == "DEPLOYED"
    deploy(api, namespace, "waiting", model="/models/small.gguf", vram="8GiB")
    assert phase(api, namespace, "waiting", *SETTLED)["lastErrorCode"] == "NoFitError"

    patch_model_deployment(api, namespace, "big", {"spec": {"state": "stopped"}})
    phase(api, namespace, "big", "STOPPED")
    wait_for(lambda: engine_pod(api, namespace, "big") is None, what="big's pod to go")
    placed = phase(api, namespace, "waiting", "DEPLOYED")
    assert "lastErrorCode" not in placed  # the merge patch sent null: the error is cleared
    pod = engine_pod(api, namespace, "waiting")
    assert pod is not None
    assert requests_of(pod)["cohabit.dev/vram-gb-gpu-0"] == "8"


class ChangesBeforeCreate(KubernetesPort):
    """The real port, with the cluster changing between our plan and the pod's creation
    (a kubelet restarting and zeroing our resource, another tenant's pod arriving)."""

    def __init__(self, api: client.ApiClient, node_selector: str, change: Any) -> None:
        super().__init__(api, node_selector=node_selector)
        self.change = change

    def create(self, body: Any) -> None:
        self.change()
        super().create(body)


@pytest.fixture
def other_namespace(api: client.ApiClient) -> Iterator[str]:
    """Another tenant's namespace."""
    core = client.CoreV1Api(api)
    name = unique("other")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def gpu_pod(name: str, namespace: str, node: str, resources: dict[str, str]) -> dict[str, Any]:
    """A pod that is not ours, bound to `node` by name (as a static or hand-placed pod is),
    asking for these extended resources."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/trainer:1",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def zero_budget(api: client.ApiClient, namespace: str, node: str) -> None:
    """What a kubelet restart does to a device plugin's resource until the plugin registers
    again: capacity and allocatable 0. Returns once the scheduler has seen it: a probe pod
    asking for 1 GiB of the budget is refused (node and pod watches are separate streams,
    so nothing else orders the two)."""
    core = client.CoreV1Api(api)
    resource = "cohabit.dev~1vram-gb-gpu-0"
    core.patch_node_status(
        node,
        [
            {"op": "replace", "path": f"/status/{part}/{resource}", "value": "0"}
            for part in ("capacity", "allocatable")
        ],
    )
    probe = gpu_pod("probe", namespace, node, {"cohabit.dev/vram-gb-gpu-0": "1"})
    del probe["spec"]["nodeName"]
    probe["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    core.create_namespaced_pod(namespace, probe)
    wait_for(
        lambda: "Insufficient" in unschedulable(core.read_namespaced_pod("probe", namespace)),
        what="the scheduler to refuse a probe on the zeroed budget",
    )
    core.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)


def unschedulable(pod: Any) -> str:
    """The scheduler's message on a pod it could not place ('' while it has not said)."""
    for found in pod.status.conditions or []:
        if found.type == "PodScheduled" and found.reason == "Unschedulable":
            return str(found.message)
    return ""


def test_a_pod_the_scheduler_refuses_after_our_plan_is_recorded_as_no_fit_and_removed(
    api: client.ApiClient, namespace: str, nodes: Nodes, other_namespace: str
) -> None:
    """Our plan said it fits, then the kubelet zeroed the budget before the pod was bound.
    Driven through the controller (no kopf, the admin's port) so the pod path, not a new
    plan, records the NoFit; the real scheduler writes the refusal it reads."""
    node = nodes.recorded(T4, "t4")
    deploy(api, namespace, "model-a", model="/models/a.gguf", vram="6GiB")
    port = ChangesBeforeCreate(
        api, f"{GROUP_LABEL}={namespace}", lambda: zero_budget(api, other_namespace, node)
    )
    settings = OperatorSettings(topology=Topology.STANDALONE_CLUSTER)
    now = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    found = get_model_deployment(api, namespace, "model-a")
    assert found is not None
    placed = controller.reconcile(port, settings, controller.model_deployment_ref(found), now=now)
    assert placed.status.phase.value == "DEPLOYING"

    core = client.CoreV1Api(api)
    wait_for(
        lambda: unschedulable(core.read_namespaced_pod("model-a-engine", namespace)),
        what="the scheduler to refuse model-a's pod",
    )
    pod = engine_pod(api, namespace, "model-a")
    assert pod is not None
    outcome = controller.observe_pod(port, settings, pod, now=now)
    assert outcome is not None and outcome.retry is Retry.LATER
    refused = status_of(api, namespace, "model-a")
    assert (refused["phase"], refused["lastErrorCode"]) == ("FAILED", "NoFitError")
    assert refused["lastErrorMessage"].startswith("insufficient_capacity: 0/")
    assert "1 Insufficient cohabit.dev/vram-gb-gpu-0" in refused["lastErrorMessage"]
    assert "node" not in refused  # the placement is cleared with the pod
    wait_for(lambda: engine_pod(api, namespace, "model-a") is None, what="the pod deleted")


def test_managed_mode_records_a_pod_refused_for_a_gpu_it_cannot_see_taken(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    other_namespace: str,
    tmp_path: Path,
) -> None:
    """Another tenant's pod holds the node's one GPU in a namespace a managed install may not
    list (its Role is its own namespace's): the plan fits, the scheduler refuses, and the
    operator's pod handler records the NoFit and removes the pod."""
    node = nodes.recorded(MANAGED_T4, "t4")
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        other_namespace, gpu_pod("trainer", other_namespace, node, {"nvidia.com/gpu": "1"})
    )
    wait_for(
        lambda: core.read_namespaced_pod("trainer", other_namespace).status.phase == "Running",
        what="the other tenant's pod to run",
    )
    release, _ = operators.start(mode="managed")
    identity = release.kubeconfig("Deployment", "operator", tmp_path)
    assert not allowed(cluster, identity, "list", "pods", other_namespace)

    deploy(api, namespace, "model-a", model="/models/a.gguf", vram="6GiB")
    refused = phase(api, namespace, "model-a", *SETTLED)
    assert refused["lastErrorCode"] == "NoFitError", refused
    assert refused["lastErrorMessage"].startswith("sharing_not_configured: 0/")
    assert "1 Insufficient nvidia.com/gpu" in refused["lastErrorMessage"]
    wait_for(lambda: engine_pod(api, namespace, "model-a") is None, what="the pod deleted")


def test_managed_mode_places_whole_gpus_and_may_not_write_nodes(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    tmp_path: Path,
) -> None:
    nodes.recorded(MANAGED_T4, "t4")
    release, _ = operators.start(mode="managed")
    deploy(api, namespace, "chat", model="/models/a.gguf", vram="6GiB")
    placed = phase(api, namespace, "chat", *SETTLED)
    assert placed["phase"] == "DEPLOYED", placed
    assert placed["notices"] == ["SharingNotConfigured"]
    assert (placed["sharingClass"], placed["allocatedCapacityGb"]) == ("whole_gpu", 15)
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None and requests_of(pod) == {**HOST, "nvidia.com/gpu": "1"}

    deploy(api, namespace, "second", model="/models/b.gguf", vram="2GiB")
    refused = phase(api, namespace, "second", *SETTLED)
    assert refused["lastErrorMessage"].startswith("sharing_not_configured: "), refused
    assert engine_pod(api, namespace, "second") is None

    # The managed install's identity: nodes read-only, pods only in its own namespace.
    identity = release.kubeconfig("Deployment", "operator", tmp_path)
    assert allowed(cluster, identity, "list", "nodes")
    assert not allowed(cluster, identity, "patch", "nodes")
    assert not allowed(cluster, identity, "patch", "nodes/status")
    assert allowed(cluster, identity, "list", "pods", namespace)
    assert not allowed(cluster, identity, "list", "pods", "--all-namespaces")


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        pytest.param(
            {"model": "/models/m.gguf", "vram": "6GiB", "requiredVendor": "amd"}, "NoFitError",
            "vendor_mismatch: 0/1 nodes fit: 1 vendor mismatch", id="never-fits",
        ),
        pytest.param(
            {"model": "/no/such/model"}, "InvalidSpec",
            "ModelDeployment {namespace}/bad: cannot estimate '/no/such/model'",
            id="no-estimate",
        ),
    ],
)  # fmt: skip
def test_permanent_refusals_are_recorded(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    spec: dict[str, Any],
    code: str,
    message: str,
) -> None:
    nodes.recorded(T4, "t4")
    operators.start()
    deploy(api, namespace, "bad", **spec)
    refused = phase(api, namespace, "bad", *SETTLED)
    assert refused["lastErrorCode"] == code
    assert refused["lastErrorMessage"].startswith(message.format(namespace=namespace))
    assert not controller.waiting(spec, refused)  # never retried
    assert engine_pod(api, namespace, "bad") is None


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            {"mode": "managed"}, (Topology.MANAGED_CLUSTER, True, "namespace", False),
            id="managed-counts-only-its-namespace",
        ),
        pytest.param(
            {"placement": {"vramPluginV2": {"enabled": False}},
             "agent": {"budgetBackend": "status-patch"}},
            (Topology.STANDALONE_CLUSTER, False, None, True),
            id="standalone-status-patch-pins-gpus-by-env",
        ),
    ],
)  # fmt: skip
def test_settings_from_the_installed_chart(
    namespace: str, operators: Operators, values: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    """The operator's settings from the environment of the Deployment helm installed (as the
    kubelet resolves it), not from a hand-written environment."""
    release = operators.install(**values)
    env = container_env(release.container("Deployment", "operator"), namespace=namespace)
    settings = settings_from_env(env)
    topology, fractional, pods_namespace, inject = expected
    assert (
        settings.topology,
        settings.fractional,
        settings.pods_namespace,
        settings.inject_visible_devices,
    ) == (topology, fractional, namespace if pods_namespace else None, inject)
    assert settings.watch_namespace == namespace
    assert settings.engine_resources == {"requests": HOST, "limits": HOST_LIMITS}
    assert settings.run_as_user == 65532
    assert settings.hard_limit_library is None


def test_chart_images_and_enforcement_reach_the_engine_pod(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    nodes.recorded(T4, "t4")
    release, _ = operators.start(
        engines={"images": {"vllm": {"nvidia": "registry.local/vllm:1"}}},
        enforce="hami-core",
        hamiCore={"libraryPath": "/opt/hami/libvgpu.so"},
    )
    deploy(api, namespace, "chat", engine="vllm", model="/models/qwen", vram="6GiB")
    assert phase(api, namespace, "chat", *SETTLED)["phase"] == "DEPLOYED"
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.local/vllm:1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_PRELOAD"] == "/opt/hami/libvgpu.so"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["hami-core"]["hostPath"] == {"path": "/opt/hami/libvgpu.so", "type": "File"}
    # The other engine keeps the chart's default image.
    env = container_env(release.container("Deployment", "operator"), namespace=namespace)
    settings = settings_from_env(env)
    assert settings.images["llamacpp"]["cpu"] == "ghcr.io/ggml-org/llama.cpp:server"


def test_whole_gpu_mode_on_a_standalone_cluster_schedules_on_our_device_resource(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """With fractional placement off our agent publishes `cohabit.dev/gpu-0: 1`: the first
    model takes the card, the next waits (the card may come free: not final)."""
    node = nodes.recorded(T4, "t4", resources={"cohabit.dev/gpu-0": "1"})
    operators.start(placement={"vramPluginV2": {"enabled": False}})
    deploy(api, namespace, "chat", model="/models/a.gguf", vram="6GiB")
    placed = phase(api, namespace, "chat", *SETTLED)
    assert placed["phase"] == "DEPLOYED", placed
    assert (placed["sharingClass"], placed["allocatedCapacityGb"]) == ("whole_gpu", 15)
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None and requests_of(pod) == {**HOST, "cohabit.dev/gpu-0": "1"}
    assert bound(pod) == node

    deploy(api, namespace, "second", model="/models/b.gguf", vram="2GiB")
    refused = phase(api, namespace, "second", *SETTLED)
    assert refused["phase"] == "FAILED", refused
    assert refused["noFit"]["permanent"] is False
    assert engine_pod(api, namespace, "second") is None


def test_no_fit_that_the_empty_cluster_cannot_hold_is_final(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """40 GiB per GPU on a 15 GiB T4: no amount of waiting helps, so it is FAILED for good
    (kopf's PermanentError, never retried), as admission refuses it at once locally; 12 GiB
    beside a 10 GiB holder waits, and is placed when the holder goes."""
    nodes.recorded(T4, "t4")
    operators.start()
    deploy(api, namespace, "holder", model="/models/h.gguf", vram="10GiB")
    assert phase(api, namespace, "holder", *SETTLED)["phase"] == "DEPLOYED"
    deploy(api, namespace, "huge", model="/models/x.gguf", vram="40GiB")
    deploy(api, namespace, "waits", model="/models/w.gguf", vram="12GiB")
    huge = phase(api, namespace, "huge", *SETTLED)
    waits = phase(api, namespace, "waits", *SETTLED)
    assert (huge["noFit"]["permanent"], waits["noFit"]["permanent"]) == (True, False)
    assert huge["lastErrorMessage"].startswith("insufficient_capacity: ")
    assert not controller.waiting({}, huge)
    assert controller.waiting({}, waits)
    before = (get_model_deployment(api, namespace, "huge") or {})["metadata"]["resourceVersion"]

    delete_model_deployment(api, namespace, "holder")
    phase(api, namespace, "waits", "DEPLOYED")
    after = get_model_deployment(api, namespace, "huge") or {}
    assert after["metadata"]["resourceVersion"] == before  # the pass that placed `waits`
    assert after["status"]["phase"] == "FAILED"  # left `huge` alone


def set_ready(api: client.ApiClient, namespace: str, pod: str, *, ready: bool) -> None:
    """Write the pod's Ready condition as its kubelet would: an engine still loading its
    model is Running but not Ready until its readiness probe passes."""
    state = "True" if ready else "False"
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod,
        namespace,
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": state},
                    {"type": "ContainersReady", "status": state},
                ]
            }
        },
    )


def gates(pod: dict[str, Any] | None) -> list[dict[str, str]]:
    return list(((pod or {}).get("spec") or {}).get("schedulingGates") or [])


def test_engines_start_one_at_a_time_per_device(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """The second engine on a card is created gated and released only once the first is
    Ready: two engines never size themselves against the same free memory at once. The
    real scheduler leaves a gated pod alone (PodScheduled False, SchedulingGated)."""
    node = nodes.recorded(T4, "t4")
    operators.start()
    deploy(api, namespace, "first", model="/models/a.gguf", vram="6GiB")
    wait_for(lambda: bound(engine_pod(api, namespace, "first")), what="the first pod bound")
    set_ready(api, namespace, "first-engine", ready=False)
    wait_for(
        lambda: status_of(api, namespace, "first").get("phase") == "INITIALIZING",
        what="the first engine seen starting",
    )

    deploy(api, namespace, "second", model="/models/b.gguf", vram="6GiB")
    second = wait_for(lambda: engine_pod(api, namespace, "second"), what="the second pod")
    assert gates(second) == [{"name": START_GATE}]
    assert not gates(engine_pod(api, namespace, "first"))
    held = phase(api, namespace, "second", "DEPLOYING")
    assert held["allocatedCapacityGb"] == 6  # its budget is held while it waits
    core = client.CoreV1Api(api)
    wait_for(
        lambda: any(
            c.type == "PodScheduled" and c.reason == "SchedulingGated"
            for c in core.read_namespaced_pod("second-engine", namespace).status.conditions or []
        ),
        what="the scheduler to leave the gated pod alone",
    )

    set_ready(api, namespace, "first-engine", ready=True)
    wait_for(lambda: not gates(engine_pod(api, namespace, "second")), what="second released")
    wait_for(lambda: bound(engine_pod(api, namespace, "second")) == node, what="second bound")
    assert phase(api, namespace, "second", *SETTLED)["phase"] == "DEPLOYED"


def test_paused_deployment_frees_its_device_and_keeps_its_service(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    nodes.recorded(T4, "t4")
    operators.start()
    deploy(api, namespace, "chat", model="/models/a.gguf", vram="6GiB")
    assert phase(api, namespace, "chat", *SETTLED)["phase"] == "DEPLOYED"
    patch_model_deployment(api, namespace, "chat", {"spec": {"state": "paused"}})
    paused = phase(api, namespace, "chat", "PAUSED")
    assert paused["serviceName"] == "chat"
    wait_for(lambda: engine_pod(api, namespace, "chat") is None, what="the pod to go")
    service = client.CoreV1Api(api).read_namespaced_service("chat", namespace)
    assert service.spec.selector == {"cohabit.dev/model-deployment": "chat"}
