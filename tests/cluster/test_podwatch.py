"""Layer: kube/podwatch.py on a real API server. The operator's pods come from a watch, and
a read is never older than what it must include: this port's own pod writes, and every
write up to the version the caller names, by anyone; pods that do not change at all after
that version (a quiet cluster) are listed afresh."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from cohabit.kube.podwatch import WatchedPods
from tests.cluster.harness import body, plain_pod, unique


@pytest.fixture
def port(api: client.ApiClient, namespace: str) -> Iterator[WatchedPods]:
    watched = WatchedPods(api, namespace=namespace)
    watched.start()
    yield watched
    watched.stop()


def _pod(namespace: str) -> dict[str, Any]:
    # Never bound (no node has the name): a deletion is immediate, nothing else changes it.
    return plain_pod(unique("p"), namespace, hostname="no-such-node", resources={"cpu": "10m"})


def _names(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def test_a_pod_this_port_creates_is_in_the_next_read(port: WatchedPods, namespace: str) -> None:
    pod = _pod(namespace)
    port.create(pod)
    name = pod["metadata"]["name"]
    assert port.get_pod(namespace, name) is not None
    assert name in _names(port.list_pods(namespace))
    port.delete_pod(namespace, name)  # never bound, so deleted at once
    assert port.get_pod(namespace, name) is None
    assert name not in _names(port.list_pods(namespace))


def test_writes_by_others_up_to_the_version_named_are_in_the_answer(
    api: client.ApiClient, port: WatchedPods, namespace: str
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
    api: client.ApiClient, port: WatchedPods, namespace: str
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


def test_pods_of_another_namespace_are_listed_not_watched(
    api: client.ApiClient, port: WatchedPods, namespace: str, tenant_namespace: str
) -> None:
    core = client.CoreV1Api(api)
    other = body(
        core.create_namespaced_pod(tenant_namespace, _pod(tenant_namespace), _preload_content=False)
    )
    assert other["metadata"]["name"] in _names(port.list_pods(tenant_namespace))
    assert other["metadata"]["name"] not in _names(port.list_pods(namespace))
