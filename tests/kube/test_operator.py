"""The placement operator's full loop: kopf (its real watch/patch client) against kmock's
emulated API server on 127.0.0.1, with the official client behind `KubernetesPort`.

kmock has no scheduler: `FakeScheduler` is a test-side stand-in that binds a pending pod when
the extended resources of every pod on its affinity node fit that node's allocatable, and
otherwise marks it `PodScheduled=False/Unschedulable` in kube-scheduler's words. Nodes are the
recorded label fixtures; the GPUs are never touched. Tests assert end states (kopf may run a
handler twice against kmock, which keeps no resourceVersion).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import kopf
import pytest
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import (
    ModelDeploymentRef,
    OperatorSettings,
    Retry,
    observe_pod,
    reconcile,
)
from cohabit.kube.operator import _raise_for, _waiting_for_room, register, settings_from_env
from tests.kube.conftest import node_object
from tests.kube.emulator import (
    MODEL_DEPLOYMENTS,
    NODES,
    PODS,
    Emulator,
    FakeKubelet,
    FakeScheduler,
    wait_for,
)

NAMESPACE = "team-a"
RETRY_S = 1.0


@contextmanager
def running_operator(emulator: Emulator, settings: OperatorSettings) -> Iterator[None]:
    """kopf.operator() on its own loop in a thread, stopped (and joined) on exit."""
    registry = kopf.OperatorRegistry()
    register(registry, retry_delay_s=RETRY_S)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=emulator.url, insecure=True)

    memo = kopf.Memo(port=KubernetesPort(emulator.api()), settings=settings)
    stop, ready = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    memo=memo,
                    clusterwide=False,
                    namespaces=[NAMESPACE],
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as error:  # reported by the test, not lost in the thread
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(20), "the operator did not start"
        yield
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive(), "the operator did not stop"
    assert failures == []


def cluster(emulator: Emulator, *fixtures: str) -> None:
    emulator.put(("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    for fixture in fixtures:
        emulator.put(NODES, node_object(fixture))


def deploy(emulator: Emulator, name: str, **spec: Any) -> None:
    body = {
        "apiVersion": crd.API_VERSION,
        "kind": crd.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }
    client.CustomObjectsApi(emulator.api()).create_namespaced_custom_object(
        crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, body
    )


def status(emulator: Emulator, name: str) -> dict[str, Any]:
    found = emulator.get(MODEL_DEPLOYMENTS, name) or {}
    return dict(found.get("status") or {})


def phase_of(emulator: Emulator, name: str, phase: str) -> dict[str, Any] | None:
    current = status(emulator, name)
    return current if current.get("phase") == phase else None


def pods(emulator: Emulator) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in emulator.objects(PODS)}


def requests_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"]["requests"])


STANDALONE = OperatorSettings(topology=Topology.STANDALONE_CLUSTER, retry_delay_s=RETRY_S)
MANAGED = OperatorSettings(
    topology=Topology.MANAGED_CLUSTER, pods_namespace=NAMESPACE, retry_delay_s=RETRY_S
)


def test_two_models_share_one_gpu_budget_and_a_third_fails_fast_with_no_pod(
    emulator: Emulator,
) -> None:
    cluster(emulator, "labels_t4_standalone.json")
    scheduler = FakeScheduler(emulator)
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "model-a", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        deploy(emulator, "model-b", model="meta-llama/Llama-3.2-1B-Instruct", vram="6GiB")
        for name in ("model-a", "model-b"):
            wait_for(lambda n=name: phase_of(emulator, n, "DEPLOYING"), what=f"{name} placed")
        deploy(emulator, "model-c", model="google/gemma-2-2b-it", vram="6GiB")
        refused = wait_for(lambda: phase_of(emulator, "model-c", "FAILED"), what="model-c NoFit")

        assert refused["lastErrorCode"] == "NoFitError"
        assert refused["lastErrorMessage"] == (
            "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory "
            "(largest free 3 GiB on edge-t4-1 gpu 0)"
        )
        assert refused["noFit"]["requestedBytes"] == 6 << 30
        assert refused["lastErrorAt"].endswith("Z")
        assert sorted(pods(emulator)) == ["model-a-engine", "model-b-engine"]
        for pod in pods(emulator).values():
            assert requests_of(pod) == {"cohabit.dev/vram-gb-gpu-0": "6"}
            assert "nodeName" not in pod["spec"]

        placed = status(emulator, "model-a")
        assert (placed["node"], placed["gpuIndices"], placed["allocatedCapacityGb"]) == (
            "edge-t4-1",
            [0],
            6,
        )
        assert (placed["hardwareClass"], placed["sharingClass"]) == (
            "software_shared",
            "fractional",
        )

        scheduler.step()  # model-b waits at the start gate until model-a is up
        assert pods(emulator)["model-a-engine"]["spec"].get("nodeName") == "edge-t4-1"
        emulator.patch(
            PODS, "model-a-engine", {"status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}},
        )  # fmt: skip
        deployed = wait_for(lambda: phase_of(emulator, "model-a", "DEPLOYED"), what="ready")
        ready = [c for c in deployed["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]
        wait_for(
            lambda: not pods(emulator)["model-b-engine"]["spec"].get("schedulingGates"),
            what="model-b released",
        )
        scheduler.step()  # 6 + 6 GiB of 15: both bound
        assert all(p["spec"].get("nodeName") == "edge-t4-1" for p in pods(emulator).values())
        assert "model-c-engine" not in pods(emulator)


def test_a_stopped_deployment_frees_its_budget_for_one_waiting(emulator: Emulator) -> None:
    cluster(emulator, "labels_t4_standalone.json")
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "big", model="Qwen/Qwen2.5-7B-Instruct", vram="12GiB")
        wait_for(lambda: phase_of(emulator, "big", "DEPLOYING"), what="big placed")
        deploy(emulator, "waiting", model="Qwen/Qwen2.5-3B-Instruct", vram="8GiB")
        wait_for(lambda: phase_of(emulator, "waiting", "FAILED"), what="waiting refused")

        client.CustomObjectsApi(emulator.api()).patch_namespaced_custom_object(
            crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, "big",
            {"metadata": {"generation": 2}, "spec": {"state": "stopped"}},
        )  # fmt: skip
        wait_for(lambda: phase_of(emulator, "big", "STOPPED"), what="big stopped")
        assert "big-engine" not in pods(emulator)
        placed = wait_for(lambda: phase_of(emulator, "waiting", "DEPLOYING"), what="retried")
        assert "lastErrorCode" not in placed  # the merge patch sent null: the error is cleared
        assert requests_of(pods(emulator)["waiting-engine"]) == {"cohabit.dev/vram-gb-gpu-0": "8"}


def zero_budget(emulator: Emulator) -> None:
    """The kubelet restarts and zeroes our extended resource before the pod is scheduled."""
    FakeKubelet(emulator, "edge-t4-1").restart()


def foreign_gpu_pod(emulator: Emulator) -> None:
    """Another tenant's pod, in a namespace a managed install cannot list, takes the card."""
    emulator.put(PODS, {
        "metadata": {"name": "their-trainer", "namespace": "team-b"},
        "spec": {"nodeName": "t4-node-0", "containers": [{"name": "c", "resources": {
            "requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "settings", "interfere", "message"),
    [
        pytest.param(
            "labels_t4_standalone.json", STANDALONE, zero_budget,
            "insufficient_capacity: 0/1 nodes are available: 1 Insufficient "
            "cohabit.dev/vram-gb-gpu-0.",
            id="standalone-budget-zeroed",
        ),
        pytest.param(
            "labels_t4.json", MANAGED, foreign_gpu_pod,
            "sharing_not_configured: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
            id="managed-whole-gpu-taken-by-another-tenant",
        ),
    ],
)  # fmt: skip
def test_pod_left_unschedulable_is_recorded_as_no_fit_and_removed(
    emulator: Emulator, fixture: str, settings: OperatorSettings, interfere: Any, message: str
) -> None:
    """Our plan said it fits, then the cluster changed before scheduling. Driven through the
    controller (no kopf) so the pod path, not a re-plan, records the NoFit."""
    cluster(emulator, fixture)
    port = KubernetesPort(emulator.api())
    deploy(emulator, "model-a", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
    body = emulator.get(MODEL_DEPLOYMENTS, "model-a") or {}
    ref = ModelDeploymentRef(
        name="model-a",
        namespace=NAMESPACE,
        uid=body["metadata"]["uid"],
        generation=1,
        spec=body["spec"],
        status={},
    )
    now = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)
    assert reconcile(port, settings, ref, now=now).status.phase is crd.Phase.DEPLOYING
    interfere(emulator)
    FakeScheduler(emulator).step()

    outcome = observe_pod(port, settings, pods(emulator)["model-a-engine"], now=now)
    assert outcome is not None and outcome.retry is Retry.LATER
    refused = status(emulator, "model-a")
    assert (refused["phase"], refused["lastErrorCode"]) == ("FAILED", "NoFitError")
    assert refused["lastErrorMessage"] == message
    assert "node" not in refused  # the placement is cleared with the pod
    assert "model-a-engine" not in pods(emulator)


def test_operator_loop_records_a_refused_pod_as_no_fit(emulator: Emulator) -> None:
    cluster(emulator, "labels_t4_standalone.json")
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "model-a", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        wait_for(lambda: "model-a-engine" in pods(emulator), what="pod created")
        FakeKubelet(emulator, "edge-t4-1").restart()
        FakeScheduler(emulator).step()
        refused = wait_for(lambda: phase_of(emulator, "model-a", "FAILED"), what="NoFit")
        assert refused["lastErrorCode"] == "NoFitError"
        assert refused["lastErrorMessage"].startswith("insufficient_capacity: 0/1 nodes ")
        wait_for(lambda: "model-a-engine" not in pods(emulator), what="pod deleted")


def test_managed_mode_places_whole_gpus_and_never_writes_nodes(emulator: Emulator) -> None:
    cluster(emulator, "labels_t4.json")
    with running_operator(emulator, MANAGED):
        deploy(emulator, "chat", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        placed = wait_for(lambda: phase_of(emulator, "chat", "DEPLOYING"), what="placed")
        assert placed["notices"] == ["SharingNotConfigured"]
        assert (placed["sharingClass"], placed["allocatedCapacityGb"]) == ("whole_gpu", 15)
        assert requests_of(pods(emulator)["chat-engine"]) == {"nvidia.com/gpu": "1"}

        deploy(emulator, "second", model="meta-llama/Llama-3.2-1B-Instruct", vram="2GiB")
        refused = wait_for(lambda: phase_of(emulator, "second", "FAILED"), what="refused")
        assert refused["lastErrorMessage"].startswith("sharing_not_configured: ")
        assert "second-engine" not in pods(emulator)

    calls = emulator.requests()
    node_calls = [(method, path) for method, path in calls if path.startswith("/api/v1/nodes")]
    assert node_calls and {method for method, _ in node_calls} == {"GET"}
    assert ("GET", "/api/v1/pods") not in calls  # only our namespace's pods are read


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        pytest.param(
            {"model": "m", "vram": "6GiB", "requiredVendor": "amd"}, "NoFitError",
            "vendor_mismatch: 0/1 nodes fit: 1 vendor mismatch", id="never-fits",
        ),
        pytest.param(
            {"model": "/no/such/model"}, "InvalidSpec",
            "ModelDeployment team-a/bad: cannot estimate '/no/such/model'", id="no-estimate",
        ),
    ],
)  # fmt: skip
def test_permanent_refusals_are_recorded(
    emulator: Emulator, spec: dict[str, Any], code: str, message: str
) -> None:
    cluster(emulator, "labels_t4_standalone.json")
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "bad", **spec)
        refused = wait_for(lambda: phase_of(emulator, "bad", "FAILED"), what="refused")
    assert refused["lastErrorCode"] == code
    assert refused["lastErrorMessage"].startswith(message)
    assert pods(emulator) == {}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {"COHABIT_MODE": "managed", "COHABIT_NAMESPACE": "cohabit",
             "COHABIT_FRACTIONAL": "true"},
            (Topology.MANAGED_CLUSTER, True, "cohabit", False),
            id="managed-counts-only-its-namespace",
        ),
        pytest.param(
            {"COHABIT_MODE": "standalone", "COHABIT_NAMESPACE": "cohabit",
             "COHABIT_FRACTIONAL": "false", "COHABIT_BUDGET_BACKEND": "status-patch"},
            (Topology.STANDALONE_CLUSTER, False, None, True),
            id="standalone-status-patch-pins-gpus-by-env",
        ),
    ],
)  # fmt: skip
def test_settings_from_the_chart_env(env: dict[str, str], expected: tuple) -> None:
    settings = settings_from_env(env)
    assert (
        settings.topology,
        settings.fractional,
        settings.pods_namespace,
        settings.inject_visible_devices,
    ) == expected


def test_chart_images_and_enforcement_reach_the_operator() -> None:
    settings = settings_from_env({
        "COHABIT_ENGINE_IMAGES": '{"vllm": {"nvidia": "registry.local/vllm:1"}}',
        "COHABIT_ENFORCE": "hami-core",
        "COHABIT_HAMI_LIBRARY": "/opt/hami/libvgpu.so",
    })  # fmt: skip
    assert settings.images["vllm"] == {
        "nvidia": "registry.local/vllm:1",
        "amd": "vllm/vllm-openai-rocm:v0.18.0",
    }
    assert settings.images["llamacpp"]["cpu"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert settings.hard_limit_library == "/opt/hami/libvgpu.so"
    assert settings_from_env({}).hard_limit_library is None


def whole_gpu_node() -> dict[str, Any]:
    """The one-T4 node as our agent leaves it with fractional placement off."""
    node = node_object("labels_t4_standalone.json")
    for field in ("capacity", "allocatable"):
        node["status"][field] = {
            **{k: v for k, v in node["status"][field].items() if "/" not in k},
            "cohabit.dev/gpu-0": "1",
        }
    return node


def test_whole_gpu_mode_on_a_standalone_cluster_schedules_on_our_device_resource(
    emulator: Emulator,
) -> None:
    emulator.put(("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
    emulator.put(NODES, whole_gpu_node())
    settings = OperatorSettings(
        topology=Topology.STANDALONE_CLUSTER, fractional=False, retry_delay_s=RETRY_S
    )
    scheduler = FakeScheduler(emulator)
    with running_operator(emulator, settings):
        deploy(emulator, "chat", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        placed = wait_for(lambda: phase_of(emulator, "chat", "DEPLOYING"), what="placed")
        assert (placed["sharingClass"], placed["allocatedCapacityGb"]) == ("whole_gpu", 15)
        assert requests_of(pods(emulator)["chat-engine"]) == {"cohabit.dev/gpu-0": "1"}
        scheduler.step()
        assert pods(emulator)["chat-engine"]["spec"].get("nodeName") == "edge-t4-1"

        deploy(emulator, "second", model="meta-llama/Llama-3.2-1B-Instruct", vram="2GiB")
        refused = wait_for(lambda: phase_of(emulator, "second", "FAILED"), what="refused")
        assert refused["noFit"]["permanent"] is False  # the card may come free
        assert "second-engine" not in pods(emulator)


def test_no_fit_that_the_empty_cluster_cannot_hold_is_final(emulator: Emulator) -> None:
    """40 GiB per GPU on a 15 GiB T4: no amount of waiting helps, so it is FAILED for good
    (kopf PermanentError, no retry timer), as admission refuses it at once locally."""
    cluster(emulator, "labels_t4_standalone.json")
    port = KubernetesPort(emulator.api())
    deploy(emulator, "huge", model="Qwen/Qwen2.5-72B-Instruct", vram="40GiB")
    deploy(emulator, "waits", model="Qwen/Qwen2.5-7B-Instruct", vram="12GiB")
    deploy(emulator, "holder", model="Qwen/Qwen2.5-7B-Instruct", vram="10GiB")
    now = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)

    def ref(name: str) -> ModelDeploymentRef:
        body = emulator.get(MODEL_DEPLOYMENTS, name) or {}
        return ModelDeploymentRef(
            name=name, namespace=NAMESPACE, uid=body["metadata"]["uid"], generation=1,
            spec=body["spec"], status={},
        )  # fmt: skip

    assert reconcile(port, STANDALONE, ref("holder"), now=now).retry is Retry.NONE
    final = reconcile(port, STANDALONE, ref("huge"), now=now)
    later = reconcile(port, STANDALONE, ref("waits"), now=now)
    assert (final.retry, later.retry) == (Retry.NEVER, Retry.LATER)
    assert status(emulator, "huge")["noFit"]["permanent"] is True
    assert status(emulator, "waits")["noFit"]["permanent"] is False
    assert status(emulator, "huge")["lastErrorMessage"].startswith("insufficient_capacity: ")
    with pytest.raises(kopf.PermanentError):
        _raise_for(final, delay_s=RETRY_S)
    with pytest.raises(kopf.TemporaryError):
        _raise_for(later, delay_s=RETRY_S)
    assert not _waiting_for_room(spec={}, status=status(emulator, "huge"))
    assert _waiting_for_room(spec={}, status=status(emulator, "waits"))


def test_engines_start_one_at_a_time_per_device(emulator: Emulator) -> None:
    """The second engine on a card is created gated and released only once the first is
    Ready: two engines never size themselves against the same free memory at once."""
    cluster(emulator, "labels_t4_standalone.json")
    scheduler = FakeScheduler(emulator)
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "first", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        wait_for(lambda: "first-engine" in pods(emulator), what="first pod")
        deploy(emulator, "second", model="meta-llama/Llama-3.2-1B-Instruct", vram="6GiB")
        wait_for(lambda: "second-engine" in pods(emulator), what="second pod")
        gates = pods(emulator)["second-engine"]["spec"].get("schedulingGates")
        assert gates == [{"name": "cohabit.dev/one-start-per-device"}]
        assert not pods(emulator)["first-engine"]["spec"].get("schedulingGates")
        held = wait_for(lambda: phase_of(emulator, "second", "DEPLOYING"), what="second placed")
        assert held["allocatedCapacityGb"] == 6  # its budget is held while it waits

        scheduler.step()
        assert pods(emulator)["first-engine"]["spec"].get("nodeName") == "edge-t4-1"
        assert not pods(emulator)["second-engine"]["spec"].get("nodeName")

        emulator.patch(
            PODS, "first-engine", {"status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}},
        )  # fmt: skip
        wait_for(
            lambda: not pods(emulator)["second-engine"]["spec"].get("schedulingGates"),
            what="the second pod released",
        )
        scheduler.step()
        assert pods(emulator)["second-engine"]["spec"].get("nodeName") == "edge-t4-1"


def test_paused_deployment_frees_its_device_and_keeps_its_service(emulator: Emulator) -> None:
    cluster(emulator, "labels_t4_standalone.json")
    with running_operator(emulator, STANDALONE):
        deploy(emulator, "chat", model="Qwen/Qwen2.5-1.5B-Instruct", vram="6GiB")
        wait_for(lambda: "chat-engine" in pods(emulator), what="pod")
        client.CustomObjectsApi(emulator.api()).patch_namespaced_custom_object(
            crd.GROUP, crd.VERSION, NAMESPACE, crd.PLURAL, "chat",
            {"metadata": {"generation": 2}, "spec": {"state": "paused"}},
        )  # fmt: skip
        paused = wait_for(lambda: phase_of(emulator, "chat", "PAUSED"), what="paused")
        assert "chat-engine" not in pods(emulator)
        assert emulator.get(("v1", "services"), "chat") is not None
        assert paused["serviceName"] == "chat"
