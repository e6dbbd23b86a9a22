"""The kmock operator loop (kopf against kmock's emulated API server) that the kmock tests
not yet ported to tests/cluster share: `test_cluster_memory.py` and `test_serve_backend.py`.
The operator's own tests run on the real control plane (tests/cluster/test_operator.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kopf
from kubernetes import client

from cohabit.hardware.model import Topology
from cohabit.kube import crd
from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.controller import OperatorSettings
from cohabit.kube.operator import register
from tests.kube.conftest import node_object
from tests.kube.emulator import MODEL_DEPLOYMENTS, NODES, Emulator

NAMESPACE = "team-a"
RETRY_S = 1.0


@contextmanager
def running_operator(emulator: Emulator, settings: OperatorSettings) -> Iterator[None]:
    """kopf.operator() on its own loop in a thread, stopped (and joined) on exit."""
    registry = kopf.OperatorRegistry()
    register(registry)

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


STANDALONE = OperatorSettings(topology=Topology.STANDALONE_CLUSTER, retry_delay_s=RETRY_S)
