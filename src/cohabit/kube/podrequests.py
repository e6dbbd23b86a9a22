"""What a pod holds on its node as the kube-scheduler counts it: pure, over the pod's wire
JSON. The cluster view (`fleetview`) reads other tenants' pods through it, so what cohabit
takes as free is what the scheduler does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_requests(pod: Mapping[str, Any]) -> dict[str, str]:
    """What the kube-scheduler counts a pod as holding, by k8s.io/component-helpers
    resource.PodRequests (what noderesources/fit.go sums per node): its containers' requests,
    plus its sidecars' (init containers with restartPolicy Always, which run alongside), or
    more while an init container would need more (each one's requests plus those of the
    sidecars started before it), plus `spec.overhead`. A limit stands for a missing request
    (the API server defaults requests to limits). Whole-number quantities are counted; any
    other (cpu "500m", memory "4Gi") is passed on as written.

    >>> pod_requests({"spec": {
    ...     "initContainers": [{"resources": {"limits": {"cohabit.dev/vram-gb-gpu-0": "10"}}}],
    ...     "containers": [{"resources": {"limits": {"cohabit.dev/vram-gb-gpu-0": "4"}}}]}})
    {'cohabit.dev/vram-gb-gpu-0': '10'}
    """
    spec = pod.get("spec") or {}
    other: dict[str, str] = {}

    def counted(resources: Mapping[str, Any]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name, value in resources.items():
            text = str(value).strip()
            if text.isdigit():
                counts[name] = int(text)
            else:
                other[name] = text
        return counts

    def requests(container: Mapping[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        return counted({**(resources.get("limits") or {}), **(resources.get("requests") or {})})

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        _add(total, requests(container))
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for container in spec.get("initContainers") or []:
        own = requests(container)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            using = dict(sidecars)
        else:
            using = dict(own)
            _add(using, sidecars)
        for name, count in using.items():
            peak[name] = max(peak.get(name, 0), count)
    for name, count in peak.items():
        total[name] = max(total.get(name, 0), count)
    _add(total, counted(spec.get("overhead") or {}))
    return {**other, **{name: str(count) for name, count in total.items()}}


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for name, count in counts.items():
        into[name] = into.get(name, 0) + count
