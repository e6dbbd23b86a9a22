"""Layer: kube/watched.py on a real API server. The operator's pods and nodes come from
watches. A pod read is never older than what it must include: this port's own pod writes,
and every write up to the version the caller names, by anyone; pods that do not change at
all after that version (a quiet cluster) are listed afresh. Nodes are as the watch
delivered them, within the node selector, and listed afresh when a read asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import controller
from cohabit.kube.controller import OperatorSettings
from cohabit.kube.watched import Watch, WatchedPort
from tests.cluster.conftest import Nodes
from tests.cluster.harness import (
    GROUP_LABEL,
    MODEL,
    apply,
    body,
    get_model_deployment,
    model_deployment,
    plain_pod,
    unique,
    wait_for,
)

T4 = "labels_t4_standalone.json"  # our agent's labels and one 15 GiB budget


NOW = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
STANDALONE = OperatorSettings(topology=Topology.STANDALONE_CLUSTER)


@contextmanager
def started(kind: type[WatchedPort], api: client.ApiClient, namespace: str) -> Iterator[Any]:
    """A port of `kind` watching the test's namespace and nodes, stopped after."""
    watched = kind(api, namespace=namespace, node_selector=f"{GROUP_LABEL}={namespace}")
    watched.start()
    try:
        yield watched
    finally:
        watched.stop()


@pytest.fixture
def port(api: client.ApiClient, namespace: str) -> Iterator[WatchedPort]:
    with started(WatchedPort, api, namespace) as watched:
        yield watched


def reconciled(
    api: client.ApiClient, port: WatchedPort, namespace: str, name: str, settings: OperatorSettings
) -> controller.Outcome:
    """The controller's reconcile (no kopf) of ModelDeployment `name` as it is now."""
    found = get_model_deployment(api, namespace, name)
    assert found is not None
    return controller.reconcile(port, settings, controller.model_deployment_ref(found), now=NOW)


def _pod(namespace: str) -> dict[str, Any]:
    # Never bound (no node has the name): a deletion is immediate, nothing else changes it.
    return plain_pod(unique("p"), namespace, hostname="no-such-node", resources={"cpu": "10m"})


def _names(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


@contextmanager
def _counted(port: WatchedPort) -> Iterator[tuple[list[str], list[str | None]]]:
    """The pod lists this thread's reads make, and the versions a read waited for in vain,
    while inside the `with`. The watch's own lists (its first one, or one after a watch
    ends) are not counted: when they come depends on the machine's load."""
    lists: list[str] = []
    waits: list[str | None] = []
    listing, caught_up = port.pods_and_version, port.pods._caught_up
    reader = threading.current_thread()

    def counted_list(namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        if threading.current_thread() is reader:
            lists.append("list")
        return listing(namespace)

    def counted_wait(seen: str | None) -> bool:
        found = caught_up(seen)
        if not found:
            waits.append(seen)
        return found

    port.pods_and_version = counted_list  # type: ignore[method-assign]
    port.pods._caught_up = counted_wait  # type: ignore[method-assign]
    try:
        yield lists, waits
    finally:
        port.pods_and_version, port.pods._caught_up = listing, caught_up  # type: ignore[method-assign]


def test_a_pod_this_port_creates_is_in_the_next_read(port: WatchedPort, namespace: str) -> None:
    pod = _pod(namespace)
    port.create(pod)
    name = pod["metadata"]["name"]
    assert port.get_pod(namespace, name) is not None
    assert name in _names(port.list_pods(namespace))
    port.delete_pod(namespace, name)  # never bound, so deleted at once
    assert port.get_pod(namespace, name) is None
    assert name not in _names(port.list_pods(namespace))


def test_a_pod_deleted_at_once_is_not_brought_back_by_an_older_event_delivered_late(
    api: client.ApiClient, namespace: str
) -> None:
    """The scheduler writes a pod's status (Unschedulable) just before the port deletes it;
    the delete's answer drops the pod, and the watch may deliver the scheduler's write only
    after that. The pod stays gone until its DELETED event. The watch is driven by hand here
    (not started) with the API server's own objects, so the late delivery is certain."""
    core = client.CoreV1Api(api)
    created = body(core.create_namespaced_pod(namespace, _pod(namespace), _preload_content=False))
    name = created["metadata"]["name"]

    def marked() -> dict[str, Any] | None:
        pod = body(core.read_namespaced_pod(name, namespace, _preload_content=False))
        conditions = (pod.get("status") or {}).get("conditions") or []
        return pod if any(c.get("reason") == "Unschedulable" for c in conditions) else None

    scheduled = wait_for(marked, what=f"the scheduler to mark {name} unschedulable")
    watch = Watch("pods", lambda: ([], "0"), lambda _version, _timeout: None)
    version = created["metadata"]["resourceVersion"]
    with watch._changed:  # a list taken before the status write
        watch._hold([created], version, time.monotonic())
    core.delete_namespaced_pod(name, namespace)  # never bound: gone at once
    watch.drop((namespace, name))
    watch._apply("MODIFIED", scheduled)  # the scheduler's write, delivered late
    with watch.held() as held:
        assert (namespace, name) not in held


def test_writes_by_others_up_to_the_version_named_are_in_the_answer(
    api: client.ApiClient, port: WatchedPort, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    created = body(core.create_namespaced_pod(namespace, _pod(namespace), _preload_content=False))
    name = created["metadata"]["name"]
    assert name in _names(port.list_pods(namespace, seen=created["metadata"]["resourceVersion"]))

    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    # A version after the deletion: the namespace's pods listed now.
    after = body(core.list_namespaced_pod(namespace, _preload_content=False))
    version = after["metadata"]["resourceVersion"]
    assert name not in _names(port.list_pods(namespace, seen=version))
    assert port.get_pod(namespace, name, seen=version) is None


def test_a_version_no_pod_event_reaches_is_answered_by_a_fresh_list(
    api: client.ApiClient, port: WatchedPort, namespace: str
) -> None:
    """A ConfigMap written after the pod: no pod changes afterwards, so the watch never
    passes its version; the read lists afresh and still has the pod."""
    core = client.CoreV1Api(api)
    created = body(core.create_namespaced_pod(namespace, _pod(namespace), _preload_content=False))
    later = body(
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": unique("cm")}}, _preload_content=False
        )
    )
    found = port.list_pods(namespace, seen=later["metadata"]["resourceVersion"])
    assert created["metadata"]["name"] in _names(found)


def test_one_pod_at_a_version_no_pod_event_reaches_is_read_from_the_server_at_once(
    api: client.ApiClient, port: WatchedPort, namespace: str
) -> None:
    """A ConfigMap written after a pod no scheduler or kubelet ever changes: no pod event
    passes its version. Reading one pod, there or not, neither waits for the watch nor lists
    every pod: it reads that pod from the API server."""
    wait_for(lambda: port.pods.includes(None), what="the pods' first list")
    core = client.CoreV1Api(api)
    pod = _pod(namespace)
    pod["spec"]["schedulerName"] = "no-such-scheduler"
    created = body(core.create_namespaced_pod(namespace, pod, _preload_content=False))
    name = created["metadata"]["name"]
    later = body(
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": unique("cm")}}, _preload_content=False
        )
    )
    version = later["metadata"]["resourceVersion"]
    with _counted(port) as (lists, waits):
        assert port.get_pod(namespace, name, seen=version) is not None
        assert port.get_pod(namespace, unique("p"), seen=version) is None
    assert (lists, waits) == ([], [])


def test_pods_of_another_namespace_are_listed_not_watched(
    api: client.ApiClient, port: WatchedPort, namespace: str, tenant_namespace: str
) -> None:
    core = client.CoreV1Api(api)
    other = body(
        core.create_namespaced_pod(tenant_namespace, _pod(tenant_namespace), _preload_content=False)
    )
    assert other["metadata"]["name"] in _names(port.list_pods(tenant_namespace))
    assert other["metadata"]["name"] not in _names(port.list_pods(namespace))


def _node_names(port: WatchedPort, *, fresh: bool = False) -> set[str]:
    """The nodes a read has; `fresh`: from a list begun now."""
    since = time.monotonic() if fresh else None
    return {n["metadata"]["name"] for n in port.list_nodes(listed_since=since)}


def test_nodes_come_from_the_watch_within_the_selector_and_afresh_when_asked(
    api: client.ApiClient, port: WatchedPort, namespace: str, nodes: Nodes
) -> None:
    """The node selector holds for the watch as for a list; a fresh read has a node at once
    (a decision that found no room confirms it so), the watch has it once it delivers it,
    and a deleted node leaves both."""
    outside = f"{namespace}-outside"
    client.CoreV1Api(api).create_node({"metadata": {"name": outside}})
    nodes.created.append(outside)  # deleted with the test's nodes
    name = nodes.add("a", ready=False)  # nobody plays its kubelet: nothing else changes it
    assert _node_names(port, fresh=True) == {name}
    wait_for(lambda: _node_names(port) == {name}, what="the watch to deliver the node")
    client.CoreV1Api(api).delete_node(name)
    assert _node_names(port, fresh=True) == set()
    wait_for(lambda: _node_names(port) == set(), what="the watch to deliver the deletion")


class NodesNotYetDelivered(WatchedPort):
    """The real port, its node watch behind: the node added a moment ago is not in it yet."""

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        return [] if listed_since is None else super().list_nodes(listed_since=listed_since)


def test_a_decision_that_finds_no_room_on_the_watches_confirms_it_on_fresh_lists(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """Driven through the controller (no kopf): the plan on what the watches hold finds no
    node, so the decision lists afresh before it says NoFit, and places on the new node."""
    node = nodes.recorded(T4, "t4")
    apply(api, model_deployment("chat", namespace, model=MODEL, vram="6GiB"))
    with started(NodesNotYetDelivered, api, namespace) as port:
        placed = reconciled(api, port, namespace, "chat", STANDALONE)
    assert (placed.status.phase.value, placed.status.node) == ("DEPLOYING", node), placed


class ListsAtOnce(NodesNotYetDelivered):
    """Each fresh list waits (up to 10 s) for the other to begin, and says whether it did."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.began = {"pods": threading.Event(), "nodes": threading.Event()}
        self.met: list[str] = []

    def _meet(self, mine: str, other: str) -> None:
        self.began[mine].set()
        if self.began[other].wait(10):
            self.met.append(mine)

    def list_pods(self, namespace: str | None, **kwargs: Any) -> list[dict[str, Any]]:
        if kwargs.get("listed_since") is not None:
            self._meet("pods", "nodes")
        return super().list_pods(namespace, **kwargs)

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        if listed_since is not None:
            self._meet("nodes", "pods")
        return super().list_nodes(listed_since=listed_since)


def test_a_no_fit_is_confirmed_on_the_pods_and_the_nodes_listed_at_once(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """The two fresh lists a NoFit found on the watches is confirmed on are made at the
    same time, not one after the other: each waits on the API server."""
    nodes.recorded(T4, "t4")
    apply(api, model_deployment("chat", namespace, model=MODEL, vram="6GiB"))
    with started(ListsAtOnce, api, namespace) as port:
        placed = reconciled(
            api, port, namespace, "chat", replace(STANDALONE, pods_namespace=namespace)
        )
    assert placed.status.phase.value == "DEPLOYING", placed
    assert sorted(port.met) == ["nodes", "pods"]


def test_a_read_asking_for_a_list_since_a_moment_lists_only_when_none_began_since(
    api: client.ApiClient, port: WatchedPort, namespace: str
) -> None:
    """A pod created by another after the last list, before the watch could deliver it
    (held here: the port's list is counted): a read asking for a list begun since a moment
    before that creation lists once, and a second read asking the same does not list
    again."""
    with _counted(port) as (lists, _):
        since = time.monotonic()
        core = client.CoreV1Api(api)
        created = body(
            core.create_namespaced_pod(namespace, _pod(namespace), _preload_content=False)
        )
        assert created["metadata"]["name"] in _names(port.list_pods(namespace, listed_since=since))
        assert lists == ["list"]
        assert created["metadata"]["name"] in _names(port.list_pods(namespace, listed_since=since))
        assert lists == ["list"]


def test_a_decision_on_a_quiet_cluster_waits_for_no_pod_event(
    api: client.ApiClient, port: WatchedPort, namespace: str, nodes: Nodes
) -> None:
    """Driven through the controller (no kopf), in a namespace with no pod at all, so no pod
    event ever passes a ModelDeployment's version: one larger than any GPU is refused
    listing the pods once (the NoFit confirmed afresh), and one that fits is placed on what
    the watch holds; neither waits for the watch in vain."""
    nodes.recorded(T4, "t4")
    settings = replace(STANDALONE, pods_namespace=namespace)
    wait_for(lambda: port.pods.includes(None), what="the pods' first list")
    wait_for(lambda: _node_names(port) != set(), what="the watch to deliver the node")

    def decided(name: str, vram: str) -> tuple[str, list[str], list[str | None]]:
        apply(api, model_deployment(name, namespace, model=MODEL, vram=vram))
        with _counted(port) as (lists, waits):
            outcome = reconciled(api, port, namespace, name, settings)
        return outcome.status.phase.value, lists, waits

    assert decided("huge", "20GiB") == ("FAILED", ["list"], [])
    assert decided("chat", "6GiB") == ("DEPLOYING", [], [])
