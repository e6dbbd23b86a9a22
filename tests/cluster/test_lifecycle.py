"""A ModelDeployment's life on a real control plane, where the operator is one actor among
several: the API server keeps a deleted pod's name while it terminates, the scheduler binds
and refuses, the pod garbage collector removes the pods of a deleted node, the Eviction API
deletes a pod as a drain does, and the garbage collector removes what a deleted
ModelDeployment owned.

The chart's operator runs here as its ServiceAccount (harness.py); kwok plays the kubelets
(no container runs: a bound pod is Running and Ready at once, a deleted one goes once it has
no finalizers, so a test holds a pod in Terminating with a finalizer of its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client, watch

from cohabit.kube import crd
from tests.cluster.conftest import Nodes, Operators, Releases
from tests.cluster.harness import (
    LAST_HANDLED,
    MODEL,
    SETTLED,
    apply,
    delete_model_deployment,
    deploy,
    engine_pod,
    engine_requests,
    get_model_deployment,
    held,
    model_deployment,
    patch_model_deployment,
    phase,
    poke,
    ready_reason,
    served_on,
    status_of,
    unhold,
    values_for,
    wait_for,
)

T4 = "labels_t4_standalone.json"  # our agent's labels and one 15 GiB budget
# The pod garbage collector deletes the pods of a node gone for its quarantine (40 s), on
# its 20 s loop (kubernetes pkg/controller/podgc/gc_controller.go: quarantineTime,
# gcCheckPeriod): up to about 80 s after the node went.
POD_GC_S = 150.0


class StatusLog:
    """Every version of one ModelDeployment the API server stored, from a watch (a poll
    could miss a status that stood for a moment), in order."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        found = self.custom.get_namespaced_custom_object(
            crd.GROUP, crd.VERSION, self.namespace, crd.PLURAL, self.name
        )
        version = found["metadata"]["resourceVersion"]
        while not self._stop.is_set():
            # Short watches, resumed where the last ended, so `stop` returns promptly.
            for event in watch.Watch().stream(
                self.custom.list_namespaced_custom_object,
                crd.GROUP,
                crd.VERSION,
                self.namespace,
                crd.PLURAL,
                field_selector=f"metadata.name={self.name}",
                resource_version=version,
                timeout_seconds=2,
            ):
                stored = event["object"]
                version = stored["metadata"]["resourceVersion"]
                self.seen.append(dict(stored.get("status") or {}))

    @contextmanager
    def recording(self) -> Iterator[StatusLog]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)


def generation_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["annotations"]["cohabit.dev/generation"])


def test_a_spec_change_waits_for_the_old_pod_to_go_before_placing_the_new_one(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: controller._decide and observe_pod against the API server's deletion. The old
    pod keeps its name while it terminates, so the new generation's pod cannot be created
    (409): the deployment says it waits (Ready False, Terminating), is never shown Ready for
    the old pod, and is placed the moment the old pod is gone, with no loss recorded."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace))
    assert deploy(api, namespace, "chat", vram="6GiB")["phase"] == "DEPLOYED"
    old = engine_pod(api, namespace, "chat")
    assert old is not None and generation_of(old) == "1"

    with (
        held(api, namespace, "chat-engine"),
        StatusLog(api, namespace, "chat").recording() as log,
    ):
        patch_model_deployment(api, namespace, "chat", {"spec": {"vram": "4GiB"}})
        waiting = wait_for(
            lambda: (
                (s := status_of(api, namespace, "chat")).get("observedGeneration") == 2
                and ready_reason(s) == crd.TERMINATING
                and s
            ),
            what="chat to wait for its old pod",
        )
        assert waiting["phase"] == "DEPLOYING"
        terminating = engine_pod(api, namespace, "chat")
        assert terminating is not None
        assert terminating["metadata"]["uid"] == old["metadata"]["uid"]
        assert terminating["metadata"].get("deletionTimestamp")
        poke(api, namespace, "chat")  # a reconcile while it terminates: still waiting
        assert ready_reason(status_of(api, namespace, "chat")) == crd.TERMINATING
        while_terminating = list(log.seen)
        unhold(api, namespace, "chat-engine")
        placed = wait_for(
            lambda: (
                (s := status_of(api, namespace, "chat")).get("phase") == "DEPLOYED"
                and s.get("observedGeneration") == 2
                and s
            ),
            what="chat's new pod to be placed and Ready",
        )

    new = engine_pod(api, namespace, "chat")
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]
    assert generation_of(new) == "2"
    assert engine_requests(api, namespace, "chat")["cohabit.dev/vram-gb-gpu-0"] == "4"
    assert "lastErrorCode" not in placed  # the old pod making way is no loss
    # What the operator said about the new spec (a status still naming generation 1 is the
    # old one's, and says so).
    shown = [s for s in while_terminating if s.get("observedGeneration") == 2]
    assert shown, "the watch saw the deployment's status while the old pod terminated"
    assert all(s.get("phase") != "DEPLOYED" for s in shown), shown
    assert all(ready_reason(s) != "Ready" for s in shown), shown


def delete_pod(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> None:
    """`kubectl delete pod`."""
    client.CoreV1Api(api).delete_namespaced_pod(pod["metadata"]["name"], namespace)


def evict(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> None:
    """What `kubectl drain` does to each pod: the Eviction API (policy/v1), which deletes
    the pod unless a PodDisruptionBudget forbids it (kubernetes
    pkg/registry/core/pod/storage/eviction.go)."""
    name = pod["metadata"]["name"]
    client.CoreV1Api(api).create_namespaced_pod_eviction(
        name,
        namespace,
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}},
    )


def delete_node(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> None:
    """The node is removed (scaled down, replaced): the pod garbage collector then marks its
    pods Failed and deletes them."""
    client.CoreV1Api(api).delete_node(pod["spec"]["nodeName"])


def evicted_by_its_kubelet(api: client.ApiClient, namespace: str, pod: dict[str, Any]) -> None:
    """A kubelet under memory pressure ends the pod and reports it Failed, reason Evicted
    (kubernetes pkg/kubelet/eviction/eviction_manager.go); the pod object stays."""
    status = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    }
    client.CoreV1Api(api).patch_namespaced_pod_status(
        pod["metadata"]["name"], namespace, {"status": status}
    )


LOSSES: dict[str, tuple[Callable[[client.ApiClient, str, dict[str, Any]], None], float]] = {
    "deleted": (delete_pod, 60.0),
    "evicted": (evict, 60.0),
    "evicted-by-its-kubelet": (evicted_by_its_kubelet, 60.0),
}


def placed_again(
    api: client.ApiClient, namespace: str, name: str, *, timeout_s: float
) -> dict[str, Any]:
    """Wait until `name` serves again with its loss recorded; its status."""
    return wait_for(
        lambda: (
            (s := status_of(api, namespace, name)).get("phase") == "DEPLOYED"
            and s.get("lastErrorCode") == crd.POD_LOST
            and s
        ),
        what=f"{name} placed again with its loss recorded",
        timeout_s=timeout_s,
    )


@pytest.mark.parametrize("how", list(LOSSES))
def test_an_unpinned_deployment_whose_pod_is_lost_is_placed_again(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators, how: str
) -> None:
    """Layer: the operator's pod handlers (controller.observe_pod, pod_gone) against what
    takes pods away on a real cluster. The loss is kept in lastError, and the deployment is
    placed again where there is room."""
    nodes.recorded(T4, "a")
    nodes.recorded(T4, "b")
    operators.start(values_for(namespace))
    first = deploy(api, namespace, "chat", vram="6GiB")
    assert first["phase"] == "DEPLOYED", first
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None
    lose, timeout_s = LOSSES[how]

    lose(api, namespace, pod)
    again = placed_again(api, namespace, "chat", timeout_s=timeout_s)
    assert f"pod {namespace}/chat-engine" in again["lastErrorMessage"], again
    assert again["lastErrorMessage"].endswith("; placed again"), again
    replaced = engine_pod(api, namespace, "chat")
    assert replaced is not None and replaced["metadata"]["uid"] != pod["metadata"]["uid"]
    assert served_on(api, namespace, "chat") == again["node"]


@pytest.mark.parametrize("how", list(LOSSES))
def test_a_pinned_deployment_whose_pod_is_lost_ends_and_is_not_placed_again(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators, how: str
) -> None:
    """Layer: controller._lost for a placement the control plane pinned (spec.placement, as
    `cohabit serve --backend kubernetes` writes it): its ledger holds the reservation, so the
    operator ends the deployment (ERROR, CONTAINER_EXITED, as for an engine that died) and
    never places it again on its own; the control plane decides what comes next."""
    node = nodes.recorded(T4, "t4")
    nodes.recorded(T4, "spare")  # room elsewhere: not taken
    operators.start(values_for(namespace))
    pin = {"node": node, "slots": [{"gpuIndex": 0}]}
    assert deploy(api, namespace, "chat", vram="6GiB", placement=pin)["phase"] == "DEPLOYED"
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None
    lose, timeout_s = LOSSES[how]

    lose(api, namespace, pod)
    ended = phase(api, namespace, "chat", "ERROR", "FAILED", timeout_s=timeout_s)
    assert (ended["phase"], ended["lastErrorCode"]) == ("ERROR", crd.POD_LOST), ended
    assert f"pod {namespace}/chat-engine" in ended["lastErrorMessage"]
    # Gone, or kept Failed for its logs (a kubelet's eviction): nothing runs in its place.
    wait_for(lambda: not running(api, namespace, "chat"), what="the lost pod to stop")
    poke(api, namespace, "chat")  # the operator reconciles it again: still ended
    assert not running(api, namespace, "chat")
    left = engine_pod(api, namespace, "chat")
    assert left is None or left["metadata"]["uid"] == pod["metadata"]["uid"]
    assert status_of(api, namespace, "chat")["phase"] == "ERROR"


def test_a_deleted_node_ends_its_pinned_deployment_and_places_its_unpinned_one_elsewhere(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: the two tests above, for the loss that takes longest (the pod garbage
    collector's quarantine), once for both kinds: a pinned and an unpinned deployment share
    a node, the node is deleted, and once its pods are gone the unpinned one serves on the
    node added since, its loss recorded, while the pinned one ends and stays ended."""
    node = nodes.recorded(T4, "a")
    operators.start(values_for(namespace))
    pin = {"node": node, "slots": [{"gpuIndex": 0}]}
    assert deploy(api, namespace, "pinned", vram="6GiB", placement=pin)["phase"] == "DEPLOYED"
    assert deploy(api, namespace, "chat", vram="6GiB")["node"] == node  # the only node
    pods = {name: engine_pod(api, namespace, name) for name in ("pinned", "chat")}
    spare = nodes.recorded(T4, "b")

    delete_node(api, namespace, {"spec": {"nodeName": node}})
    again = placed_again(api, namespace, "chat", timeout_s=POD_GC_S)
    assert (again["node"], served_on(api, namespace, "chat")) == (spare, spare)
    assert f"pod {namespace}/chat-engine" in again["lastErrorMessage"], again
    ended = phase(api, namespace, "pinned", "ERROR", "FAILED", timeout_s=POD_GC_S)
    assert (ended["phase"], ended["lastErrorCode"]) == ("ERROR", crd.POD_LOST), ended
    assert f"pod {namespace}/pinned-engine" in ended["lastErrorMessage"]
    poke(api, namespace, "pinned")  # the operator reconciles it again: still ended
    assert engine_pod(api, namespace, "pinned") is None
    assert status_of(api, namespace, "pinned")["phase"] == "ERROR"
    replaced = engine_pod(api, namespace, "chat")
    assert replaced is not None and pods["chat"] is not None
    assert replaced["metadata"]["uid"] != pods["chat"]["metadata"]["uid"]


def running(api: client.ApiClient, namespace: str, name: str) -> bool:
    """Whether ModelDeployment `name` has an engine pod that is not finished."""
    pod = engine_pod(api, namespace, name)
    return pod is not None and (pod.get("status") or {}).get("phase") != "Failed"


@pytest.mark.parametrize(
    "unusable",
    [
        pytest.param({"ready": False}, id="not-ready"),
        pytest.param(
            {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]},
            id="tainted",
        ),
    ],
)
def test_a_node_the_scheduler_would_not_bind_to_is_not_planned_onto(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    unusable: dict[str, Any],
) -> None:
    """Layer: fleetview.why_unschedulable, as the real scheduler judges nodes. The unusable
    node has less room, so bin-packing would choose it: planned there, the pod was refused
    by the scheduler, recorded as a NoFit and planned there again, on every retry. A node
    nobody reports Ready is also tainted not-ready by the API server on creation
    (plugin/pkg/admission/nodetaint)."""
    smaller = {"cohabit.dev/vram-gb-gpu-0": "8"}
    nodes.recorded(T4, "bad", capacity=smaller, allocatable=smaller, **unusable)
    good = nodes.recorded(T4, "good")
    operators.start(values_for(namespace))
    placed = deploy(api, namespace, "chat", vram="6GiB")
    assert (placed["phase"], placed["node"]) == ("DEPLOYED", good), placed
    assert served_on(api, namespace, "chat") == good


def test_no_finalizer_is_put_on_a_model_deployment(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    operators: Operators,
) -> None:
    """Layer: operator.py's handlers. kopf puts its finalizer on every object a timer serves
    (kopf/on.py, timer(): requires_finalizer=True), and a deletion then waits for the
    operator: with the operator down, a deployment waiting for room could not be deleted."""
    nodes.recorded(T4, "t4")
    operator = operators.run(releases.install(values_for(namespace)))
    assert deploy(api, namespace, "holder", vram="10GiB")["phase"] == "DEPLOYED"
    refused = deploy(api, namespace, "waiting", vram="8GiB")
    assert refused["noFit"]["permanent"] is False  # waiting for room, retried
    for name in ("holder", "waiting"):
        found = wait_for(
            lambda n=name: (
                (md := get_model_deployment(api, namespace, n))
                and LAST_HANDLED in md["metadata"].get("annotations", {})
                and md
            ),
            what=f"the operator to have handled {name}",
        )
        assert not found["metadata"].get("finalizers"), found["metadata"]

    operator.stop()
    delete_model_deployment(api, namespace, "waiting")
    try:
        wait_for(
            lambda: get_model_deployment(api, namespace, "waiting") is None,
            what="the waiting deployment to be deleted with the operator down",
            timeout_s=20,
        )
    finally:  # a finalizer left would hold the test's namespace in Terminating for good
        if get_model_deployment(api, namespace, "waiting") is not None:
            patch_model_deployment(api, namespace, "waiting", {"metadata": {"finalizers": None}})


def test_a_deployment_waiting_for_room_is_placed_when_room_frees_not_a_period_later(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Layer: operator.Retrier, woken by our pods' deletion. retrySeconds is an hour: the
    waiting deployment is placed as soon as the holder's pod (deleted by the garbage
    collector with its ModelDeployment) is gone."""
    nodes.recorded(T4, "t4")
    operators.start(values_for(namespace, placement={"retrySeconds": 3600}))
    assert deploy(api, namespace, "holder", vram="10GiB")["phase"] == "DEPLOYED"
    assert deploy(api, namespace, "waiting", vram="8GiB")["lastErrorCode"] == crd.NO_FIT_ERROR

    delete_model_deployment(api, namespace, "holder")
    placed = phase(api, namespace, "waiting", "DEPLOYED")
    assert "lastErrorCode" not in placed


def test_what_happened_while_the_operator_was_down_is_handled_when_it_starts(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    operators: Operators,
) -> None:
    """Layer: the operator's resume and create handlers. No watch event reaches a stopped
    operator; on start kopf lists every ModelDeployment and resumes each (kopf/on.py,
    resume()): a pod deleted meanwhile is found lost and placed again, a deployment created
    meanwhile is placed."""
    nodes.recorded(T4, "t4")
    release = releases.install(values_for(namespace))
    operator = operators.run(release)
    assert deploy(api, namespace, "chat", vram="6GiB")["phase"] == "DEPLOYED"
    pod = engine_pod(api, namespace, "chat")
    assert pod is not None

    operator.stop()
    delete_pod(api, namespace, pod)
    wait_for(lambda: engine_pod(api, namespace, "chat") is None, what="the pod gone")
    apply(api, model_deployment("later", namespace, model=MODEL, vram="6GiB"))
    operators.run(release)

    again = wait_for(
        lambda: (
            (s := status_of(api, namespace, "chat")).get("phase") == "DEPLOYED"
            and s.get("lastErrorCode") == crd.POD_LOST
            and s
        ),
        what="chat placed again with its loss recorded",
    )
    assert again["lastErrorMessage"] == f"pod {namespace}/chat-engine was deleted; placed again"
    assert phase(api, namespace, "later", *SETTLED)["phase"] == "DEPLOYED"
