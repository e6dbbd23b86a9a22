"""The placement operator's loop on a real control plane: the chart installed with helm, its
operator run here as the chart's ServiceAccount (harness.py), ModelDeployments created as a
user creates them, pods bound by the real kube-scheduler, which enforces the budgets the
nodes' allocatable publishes. Placement on each hardware shape, managed mode's RBAC and
whole-GPU mode are in test_placement.py and test_placement_scheduler.py.

kwok plays the kubelets: a bound pod is reported Running and Ready at once and no container
runs, so where a test needs an engine still starting it writes the pod's status as a kubelet
would. Nodes are the recorded label fixtures (the T4 edge box as our agent labels it); the
GPUs are never touched.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import controller
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import OperatorSettings, Retry
from cohabit.kube.operator import settings_from_env
from cohabit.kube.resources import DEFAULT_ENGINE_RESOURCES
from cohabit.kube.startqueue import START_GATE
from tests.cluster.conftest import Nodes, Operators, Releases
from tests.cluster.harness import (
    GROUP_LABEL,
    MANAGED,
    MODEL,
    SETTLED,
    apply,
    bound_node,
    container_env,
    delete_model_deployment,
    deploy,
    engine_pod,
    engine_requests,
    get_model_deployment,
    host_and,
    model_deployment,
    no_engine_pod,
    patch_model_deployment,
    phase,
    plain_pod,
    pod_json,
    pods,
    ready_reason,
    refused,
    restart_kubelet,
    served_on,
    status_of,
    unschedulable_message,
    values_for,
    wait_for,
)

T4 = "labels_t4_standalone.json"  # our agent's labels and one 15 GiB budget
BUDGET_0 = "cohabit.dev/vram-gb-gpu-0"


def scheduled_by_the_scheduler(api: client.ApiClient, namespace: str, pod: str) -> str:
    """The kube-scheduler's own record of binding the pod: its `Scheduled` event."""
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod}"
    )
    return " ".join(e.message for e in events.items if e.reason == "Scheduled")


def test_two_models_share_one_gpu_budget_and_a_third_fails_fast_with_no_pod(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    operators: Operators,
) -> None:
    node = nodes.recorded(T4, "t4")
    operator = operators.run(releases.install(values_for(namespace)))
    for name in ("model-a", "model-b"):
        placed = deploy(api, namespace, name, vram="6GiB")
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
    status = deploy(api, namespace, "model-c", vram="6GiB")

    message = refused(status, "insufficient_capacity", permanent=False)
    largest = f"largest free 3 GiB on {node} gpu 0"
    assert message == f"0/1 nodes fit: 1 insufficient GPU memory ({largest})"
    assert status["noFit"]["requestedBytes"] == 6 << 30
    assert status["lastErrorAt"].endswith("Z")
    engines = sorted(name for name in pods(api, namespace) if name.endswith("-engine"))
    assert engines == ["model-a-engine", "model-b-engine"]
    for name in ("model-a", "model-b"):
        assert engine_requests(api, namespace, name) == host_and({BUDGET_0: "6"})
        limits = pod_json(api, namespace, f"{name}-engine")["spec"]["containers"][0]["resources"]
        assert limits["limits"] == {**DEFAULT_ENGINE_RESOURCES["limits"], BUDGET_0: "6"}
        assert served_on(api, namespace, name) == node
        # Created without spec.nodeName: the scheduler, checking the budget, bound it.
        message = wait_for(
            lambda n=name: scheduled_by_the_scheduler(api, namespace, f"{n}-engine"),
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
    operators.start(values_for(namespace))
    assert deploy(api, namespace, "big", vram="12GiB")["phase"] == "DEPLOYED"
    assert deploy(api, namespace, "waiting", vram="8GiB")["lastErrorCode"] == "NoFitError"

    patch_model_deployment(api, namespace, "big", {"spec": {"state": "stopped"}})
    phase(api, namespace, "big", "STOPPED")
    wait_for(lambda: no_engine_pod(api, namespace, "big"), what="big's pod to go")
    placed = phase(api, namespace, "waiting", "DEPLOYED")
    assert "lastErrorCode" not in placed  # the merge patch sent null: the error is cleared
    assert engine_requests(api, namespace, "waiting")[BUDGET_0] == "8"


class ChangesBeforeCreate(KubernetesPort):
    """The real port, with the cluster changing between our plan and the pod's creation."""

    def __init__(self, api: client.ApiClient, node_selector: str, change: Any) -> None:
        super().__init__(api, node_selector=node_selector)
        self.change = change

    def create(self, body: Any) -> None:
        self.change()
        super().create(body)


def kubelet_restarted(api: client.ApiClient, namespace: str, node: str) -> None:
    """The node's kubelet restarts and zeroes our resource (`restart_kubelet`); returns once
    the scheduler has seen it: a probe pod asking for 1 GiB of the budget is refused (node
    and pod watches are separate streams, so nothing else orders the two)."""
    core = client.CoreV1Api(api)
    restart_kubelet(core, node)
    core.create_namespaced_pod(
        namespace, plain_pod("probe", namespace, hostname=node, resources={BUDGET_0: "1"})
    )
    assert "Insufficient" in unschedulable_message(api, namespace, "probe")
    core.delete_namespaced_pod("probe", namespace, grace_period_seconds=0)


def test_a_pod_the_scheduler_refuses_after_our_plan_is_recorded_as_no_fit_and_removed(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """Our plan said it fits, then the kubelet restarted and zeroed the budget before the
    pod was bound. Driven through the controller (no kopf, the admin's port) so the pod
    path, not a new plan, records the NoFit; the real scheduler writes the refusal read."""
    node = nodes.recorded(T4, "t4")
    apply(api, model_deployment("model-a", namespace, model=MODEL, vram="6GiB"))
    port = ChangesBeforeCreate(
        api, f"{GROUP_LABEL}={namespace}", lambda: kubelet_restarted(api, namespace, node)
    )
    settings = OperatorSettings(topology=Topology.STANDALONE_CLUSTER)
    now = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    found = get_model_deployment(api, namespace, "model-a")
    assert found is not None
    placed = controller.reconcile(port, settings, controller.model_deployment_ref(found), now=now)
    assert placed.status.phase.value == "DEPLOYING"

    unschedulable_message(api, namespace, "model-a-engine")
    pod = pod_json(api, namespace, "model-a-engine")
    outcome = controller.observe_pod(port, settings, pod, now=now)
    assert outcome is not None and outcome.retry is Retry.LATER
    status = status_of(api, namespace, "model-a")
    assert (status["phase"], status["lastErrorCode"]) == ("FAILED", "NoFitError")
    assert status["lastErrorMessage"].startswith("insufficient_capacity: 0/")
    assert f"1 Insufficient {BUDGET_0}" in status["lastErrorMessage"]
    assert "node" not in status  # the placement is cleared with the pod
    wait_for(lambda: no_engine_pod(api, namespace, "model-a"), what="the pod deleted")


class HeldCreate(KubernetesPort):
    """The real port, its first pod creation held until `release` is set (an API server
    slow to answer)."""

    def __init__(self, api: client.ApiClient, node_selector: str) -> None:
        super().__init__(api, node_selector=node_selector)
        self.creating = threading.Event()
        self.release = threading.Event()

    def create(self, body: Any) -> None:
        if body.get("kind") == "Pod" and not self.creating.is_set():
            self.creating.set()
            assert self.release.wait(60)
        super().create(body)


def test_a_placement_is_counted_while_its_pod_is_being_created(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """Driven through the controller (no kopf): the first decision's pod creation is held;
    a second decision, made meanwhile (decisions take turns only until a pod is decided),
    counts the first's budget and finds no room beside it, instead of taking the same one."""
    node = nodes.recorded(T4, "t4")
    for name in ("first", "second"):
        apply(api, model_deployment(name, namespace, model=MODEL, vram="10GiB"))
    port = HeldCreate(api, f"{GROUP_LABEL}={namespace}")
    settings = OperatorSettings(topology=Topology.STANDALONE_CLUSTER)
    now = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)

    def reconcile(name: str) -> controller.Outcome:
        found = get_model_deployment(api, namespace, name)
        assert found is not None
        return controller.reconcile(port, settings, controller.model_deployment_ref(found), now=now)

    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(reconcile, "first")
        assert port.creating.wait(60)
        try:
            second = reconcile("second")  # while the first pod's creation is held
        finally:
            port.release.set()
        placed = first.result(timeout=60)
    assert (placed.status.phase.value, placed.status.node) == ("DEPLOYING", node), placed
    assert (second.status.phase.value, second.status.last_error_code) == (
        "FAILED",
        "NoFitError",
    ), second
    assert engine_pod(api, namespace, "first") is not None
    assert engine_pod(api, namespace, "second") is None


def test_a_model_the_operator_cannot_size_is_refused_for_good(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """No `spec.vram` and a model the estimator cannot read: InvalidSpec, never retried
    (kopf's PermanentError), no pod."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    apply(api, model_deployment("bad", namespace, model="/no/such/model"))
    status = phase(api, namespace, "bad", *SETTLED)
    assert (status["phase"], status["lastErrorCode"]) == ("FAILED", "InvalidSpec")
    assert status["lastErrorMessage"].startswith(
        f"ModelDeployment {namespace}/bad: cannot estimate '/no/such/model'"
    )
    assert not controller.waiting({}, status)
    assert no_engine_pod(api, namespace, "bad")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param(
            MANAGED, (Topology.MANAGED_CLUSTER, True, "namespace", False),
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
    namespace: str, releases: Releases, values: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    """The operator's settings from the environment of the Deployment helm installed (as the
    kubelet resolves it), not from a hand-written environment."""
    release = releases.install(values_for(namespace, **values))
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
    assert settings.engine_resources == DEFAULT_ENGINE_RESOURCES
    assert settings.run_as_user == 65532
    assert settings.hard_limit_library is None


def test_chart_images_and_enforcement_reach_the_engine_pod(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    nodes.recorded(T4, "t4")
    release = operators.start(
        values_for(
            namespace,
            engines={"images": {"vllm": {"nvidia": "registry.local/vllm:1"}}},
            enforce="hami-core",
            hamiCore={"libraryPath": "/opt/hami/libvgpu.so"},
        )
    )
    vllm = model_deployment("chat", namespace, engine="vllm", model="/models/qwen", vram="6GiB")
    apply(api, vllm)
    assert phase(api, namespace, "chat", *SETTLED)["phase"] == "DEPLOYED"
    pod = pod_json(api, namespace, "chat-engine")
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.local/vllm:1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LD_PRELOAD"] == "/opt/hami/libvgpu.so"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["hami-core"]["hostPath"] == {"path": "/opt/hami/libvgpu.so", "type": "File"}
    # The other engine keeps the chart's default image.
    env = container_env(release.container("Deployment", "operator"), namespace=namespace)
    assert settings_from_env(env).images["llamacpp"]["cpu"] == "ghcr.io/ggml-org/llama.cpp:server"


def test_no_fit_that_the_empty_cluster_cannot_hold_is_final(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """40 GiB per GPU on a 15 GiB T4: no amount of waiting helps, so it is FAILED for good
    (kopf's PermanentError, never retried), as admission refuses it at once locally; 12 GiB
    beside a 10 GiB holder waits, and is placed when the holder goes."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    assert deploy(api, namespace, "holder", vram="10GiB")["phase"] == "DEPLOYED"
    huge = deploy(api, namespace, "huge", vram="40GiB")
    waits = deploy(api, namespace, "waits", vram="12GiB")
    # The final refusal names what the empty GPU holds, not what the holder left of it.
    assert "largest free 15 GiB" in refused(huge, "insufficient_capacity", permanent=True)
    assert "largest free 5 GiB" in refused(waits, "insufficient_capacity", permanent=False)
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


def scheduling_gated(api: client.ApiClient, namespace: str, pod: str) -> bool:
    """The scheduler leaves the pod alone for its gates (PodScheduled False, SchedulingGated:
    kubernetes pkg/scheduler/framework/plugins/schedulinggates)."""
    conditions = (pod_json(api, namespace, pod).get("status") or {}).get("conditions") or []
    return any(
        (c.get("type"), c.get("reason")) == ("PodScheduled", "SchedulingGated") for c in conditions
    )


def test_engines_start_one_at_a_time_per_device(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """The second engine on a card is created gated and released only once the first is
    Ready: two engines never size themselves against the same free memory at once."""
    node = nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    apply(api, model_deployment("first", namespace, model=MODEL, vram="6GiB"))
    assert bound_node(api, namespace, "first-engine") == node
    set_ready(api, namespace, "first-engine", ready=False)
    phase(api, namespace, "first", "INITIALIZING")

    apply(api, model_deployment("second", namespace, model=MODEL, vram="6GiB"))
    second = wait_for(lambda: engine_pod(api, namespace, "second"), what="the second pod")
    assert gates(second) == [{"name": START_GATE}]
    assert not gates(engine_pod(api, namespace, "first"))
    held = phase(api, namespace, "second", "DEPLOYING")
    assert held["allocatedCapacityGb"] == 6  # its budget is held while it waits
    wait_for(
        lambda: scheduling_gated(api, namespace, "second-engine"),
        what="the scheduler to leave the gated pod alone",
    )

    set_ready(api, namespace, "first-engine", ready=True)
    wait_for(lambda: not gates(engine_pod(api, namespace, "second")), what="second released")
    assert bound_node(api, namespace, "second-engine") == node
    assert phase(api, namespace, "second", *SETTLED)["phase"] == "DEPLOYED"


def test_paused_deployment_frees_its_device_and_keeps_its_service(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    assert deploy(api, namespace, "chat", vram="6GiB")["phase"] == "DEPLOYED"
    patch_model_deployment(api, namespace, "chat", {"spec": {"state": "paused"}})
    paused = phase(api, namespace, "chat", "PAUSED")
    assert paused["serviceName"] == "chat"
    wait_for(lambda: no_engine_pod(api, namespace, "chat"), what="the pod to go")
    service = client.CoreV1Api(api).read_namespaced_service("chat", namespace)
    assert service.spec.selector == {"cohabit.dev/model-deployment": "chat"}
