"""Our own rules for manifests, beyond what the API server checks: device budgets (extended
resources) are plain integers with requests equal to limits, every container asks for cpu
and memory (a pod without is BestEffort, the first evicted, and refused under a compute
quota), and nothing is pinned with `spec.nodeName` (that would skip the scheduler's budget
check)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_INTEGER = re.compile(r"^[0-9]+$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


def pod_specs(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    kind = doc.get("kind")
    if kind == "Pod":
        return [doc.get("spec") or {}]
    if kind in _WORKLOADS:
        return [((doc.get("spec") or {}).get("template") or {}).get("spec") or {}]
    return []


def lint(doc: Mapping[str, Any]) -> list[str]:
    """Problems in one manifest, each naming the object and the field."""
    where = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    problems: list[str] = []
    for spec in pod_specs(doc):
        if "nodeName" in spec:
            problems.append(f"{where}: spec.nodeName bypasses the scheduler")
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            resources = container.get("resources") or {}
            requests = resources.get("requests") or {}
            limits = resources.get("limits") or {}
            name = f"{where} container {container.get('name')}"
            for key in ("cpu", "memory"):
                if key not in requests:
                    problems.append(f"{name}: no {key} request")
            devices = {key for key in {**requests, **limits} if "/" in key}
            for key in sorted(devices):
                if str(requests.get(key)) != str(limits.get(key)):
                    problems.append(f"{name}: {key} requests != limits")
            for key, value in {**requests, **limits}.items():
                text = str(value)
                if "/" in key and not _INTEGER.match(text):
                    problems.append(f"{name}: {key}={text!r} is not a whole number")
                elif "/" not in key and not _QUANTITY.match(text):
                    problems.append(f"{name}: {key}={text!r} is not a quantity")
    return problems
