"""Shared pieces of the Kubernetes tests: recorded node fixtures, the emulated API server,
and the opt-in `kube_cluster` marker for tests that need a real cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import FIXTURES, run_only_when_asked
from tests.kube.emulator import Emulator
from tests.store.databases import database_url

__all__ = ["database_url"]  # SQLite and PostgreSQL, for the control plane's store

KUBE_FIXTURES = FIXTURES / "kube"
HARDWARE_FIXTURES = FIXTURES / "hardware"
CLUSTER_MARKER = "kube_cluster"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{CLUSTER_MARKER}: needs a real Kubernetes cluster (KUBECONFIG); "
        f"runs only with `pytest -m {CLUSTER_MARKER}`",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-cluster tests run only when asked for by marker."""
    run_only_when_asked(config, items, CLUSTER_MARKER)


def recorded_node(name: str) -> dict[str, Any]:
    """A recorded node (name, labels, allocatable, capacity) from tests/fixtures/kube or,
    read-only, tests/fixtures/hardware."""
    for folder in (KUBE_FIXTURES, HARDWARE_FIXTURES):
        path = folder / name
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
    raise FileNotFoundError(name)


def node_object(name: str) -> dict[str, Any]:
    """The recorded node as the API server returns it (`kubectl get node -o json`), Ready."""
    recorded = recorded_node(name)
    labels = {"kubernetes.io/hostname": recorded["name"], **recorded["labels"]}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": recorded["name"], "labels": labels},
        "status": {
            "capacity": dict(recorded.get("capacity") or {}),
            "allocatable": dict(recorded.get("allocatable") or {}),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as running:
        yield running
