"""Shared pieces of the Kubernetes tests that need no API server: recorded node fixtures, as
the API server returns them. Tests against a real one are in tests/cluster/."""

from __future__ import annotations

from typing import Any

from tests.conftest import recorded_node


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
