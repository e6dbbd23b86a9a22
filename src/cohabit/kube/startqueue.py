"""One engine start per device at a time, on Kubernetes as on one host.

An engine sizes itself while it starts (vLLM profiles the free memory, llama.cpp allocates
its buffers), so two starting on one card at once can each see the other's memory as free.
The operator therefore creates a pod whose device has another pod still starting with a
scheduling gate (`spec.schedulingGates`, GA in Kubernetes 1.30: the scheduler leaves the pod
alone until the gate is removed). The pod exists, so its budget is counted at once; it is
released when every earlier pod on its devices is Ready or has failed. Pure: the operator
passes the pods' wire JSON and removes the gates this module names.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cohabit.hardware.classify import CPU as CPU_SHARING
from cohabit.kube.fleetview import (
    ANNOTATION_DEPLOYMENT,
    ANNOTATION_NODE,
    ANNOTATION_SHARING,
    ANNOTATION_SLOTS,
)
from cohabit.kube.podstatus import pod_report

START_GATE = "cohabit.dev/one-start-per-device"
ANNOTATION_QUEUED = "cohabit.dev/queued-at"  # creation order (creationTimestamp has whole seconds)
_ENDED = frozenset({"Succeeded", "Failed"})

DeviceKey = tuple[str, int | None, int | None]


def devices_of(pod: Mapping[str, Any]) -> frozenset[DeviceKey]:
    """The devices an engine pod of ours starts on (none for CPU pools, which have no
    device to size against, or a pod that is not ours)."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    node = annotations.get(ANNOTATION_NODE)
    if not node or ANNOTATION_DEPLOYMENT not in annotations:
        return frozenset()
    if annotations.get(ANNOTATION_SHARING) == CPU_SHARING:
        return frozenset()
    try:
        slots = json.loads(annotations.get(ANNOTATION_SLOTS) or "[]")
        return frozenset((node, gpu, part) for gpu, part in slots)
    except (ValueError, TypeError):
        return frozenset()


def gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == START_GATE for gate in gates)


def starting(pod: Mapping[str, Any]) -> bool:
    """Still on its way to Ready: not gated, not finished or failing, not being deleted."""
    meta = pod.get("metadata") or {}
    if gated(pod) or meta.get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") in _ENDED:
        return False
    report = pod_report(pod)
    return not report.ready and report.error_code is None


def must_wait(pods: Iterable[Mapping[str, Any]], devices: frozenset[DeviceKey]) -> bool:
    """Whether a new pod on `devices` must start gated: another pod there is starting, or
    is itself waiting (so starts keep their order)."""
    nodes = {node for node, _, _ in devices}
    return any(
        devices & devices_of(pod) and (gated(pod) or starting(pod))
        for pod in pods
        if _node(pod) in nodes and not (pod.get("metadata") or {}).get("deletionTimestamp")
    )


def to_release(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The gated pods (namespace, name) that may start now: oldest first, each when no pod
    on its devices is starting and no older gated pod waits for one of them. Only pods on
    the waiting pods' nodes are looked at closer (a cluster's other pods cannot hold one of
    their devices)."""
    waiting = sorted((p for p in pods if gated(p)), key=_queued)
    nodes = {_node(pod) for pod in waiting}
    busy: set[DeviceKey] = set()
    for pod in pods:
        if _node(pod) in nodes and starting(pod):
            busy |= devices_of(pod)
    released: list[tuple[str, str]] = []
    for pod in waiting:
        devices = devices_of(pod)
        if not devices & busy:
            meta = pod["metadata"]
            released.append((str(meta.get("namespace")), str(meta["name"])))
        busy |= devices
    return released


def _node(pod: Mapping[str, Any]) -> str | None:
    """The node an engine pod of ours was placed on (what `devices_of` keys devices by)."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ANNOTATION_NODE)


def _queued(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    return (annotations.get(ANNOTATION_QUEUED, ""), str(meta.get("name", "")))
