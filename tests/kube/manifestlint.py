"""Our own checks on manifests, for what `kubernetes-validate` does not catch (it lets "0.5"
of an extended resource pass): extended resources are plain integers, requests equal limits,
and nothing is pinned with `spec.nodeName` (that would skip the scheduler's budget check)."""

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
            if requests != limits:
                problems.append(f"{name}: requests {requests} != limits {limits}")
            for key, value in {**requests, **limits}.items():
                text = str(value)
                if "/" in key and not _INTEGER.match(text):
                    problems.append(f"{name}: {key}={text!r} is not a whole number")
                elif "/" not in key and not _QUANTITY.match(text):
                    problems.append(f"{name}: {key}={text!r} is not a quantity")
    return problems
