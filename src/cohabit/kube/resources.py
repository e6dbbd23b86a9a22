"""The serving Pod and Service for one placed ModelDeployment: pure builders of wire JSON.

The pod is pinned with node affinity on `kubernetes.io/hostname`, never `spec.nodeName`, so
the kube-scheduler still checks the budget; it asks for exactly what the placement holds
(requests == limits, integers only): `cohabit.dev/vram-gb-gpu-<i>: N` GiB per shard, one MIG /
AMD partition, or whole vendor GPUs. A bare Pod rather than a Deployment: the operator is the
controller, and a lost pod must go back through the planner, not be recreated blindly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.kube import crd
from cohabit.kube.fleetview import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_DEPLOYMENT,
    ANNOTATION_GENERATION,
    ANNOTATION_NODE,
    ANNOTATION_SHARING,
    ANNOTATION_SLOTS,
    HOSTNAME_LABEL,
    NodeResources,
)
from cohabit.placement.planner import Placement
from cohabit.units import gib_ceil

LABEL_DEPLOYMENT = "cohabit.dev/model-deployment"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "cohabit"
CONTAINER = "engine"
BUDGET_RESOURCE = "cohabit.dev/vram-gb-gpu-{index}"
DEFAULT_IMAGES: Mapping[str, str] = {
    "vllm": "vllm/vllm-openai:v0.11.0",
    "llamacpp": "ghcr.io/ggml-org/llama.cpp:server",
}
# What each vendor's runtime reads to pick devices, when no device plugin's Allocate sets it.
VISIBLE_DEVICES: Mapping[Vendor, tuple[str, ...]] = {
    Vendor.NVIDIA: ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    Vendor.AMD: ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
}
GPU_TAINTS = ("nvidia.com/gpu", "amd.com/gpu")
# vLLM keeps 10% back by default; a whole card keeps that default.
VLLM_UTILIZATION_DIGITS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingTarget:
    """One ModelDeployment, placed: what the builders need and nothing else.

    `inject_visible_devices`: set the vendor's visible-devices env from the placement — for
    the status-patch budget backend, which has no device plugin `Allocate` to do it.
    """

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: crd.ModelDeploymentSpec
    placement: Placement
    naming: NodeResources
    inject_visible_devices: bool = False
    images: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_IMAGES))

    @property
    def pod_name(self) -> str:
        return f"{self.name}-engine"

    @property
    def service_name(self) -> str:
        return self.name


def device_requests(placement: Placement, naming: NodeResources) -> dict[str, str]:
    """Extended resources for the placement, as integer strings (requests == limits): our
    GiB budget per shard where the agent publishes one, else one partition or one whole
    vendor GPU per shard (a time-sliced replica on a shared card)."""
    counts: dict[str, int] = {}
    for allocation in placement.allocations:
        slot = allocation.slot
        if slot.hardware_class is HardwareClass.CPU:
            continue
        if slot.kind is SlotKind.PARTITION and slot.partition_profile is not None:
            name = naming.partition_resources.get(slot.partition_profile)
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
            continue
        if naming.budgets:
            index = 0 if slot.kind is SlotKind.POOL else slot.gpu_index or 0
            name = BUDGET_RESOURCE.format(index=index)
            counts[name] = counts.get(name, 0) + gib_ceil(allocation.allocated_bytes)
            continue
        if naming.whole_gpu_resource is not None:
            counts[naming.whole_gpu_resource] = counts.get(naming.whole_gpu_resource, 0) + 1
    return {name: str(count) for name, count in counts.items()}


def container_resources(placement: Placement, naming: NodeResources) -> dict[str, str]:
    """Every resource the engine container asks for: devices, and on a CPU pool the
    memory budget itself (the kube-scheduler then enforces it like a GPU budget)."""
    resources = device_requests(placement, naming)
    if placement.hardware_class is HardwareClass.CPU:
        resources["memory"] = f"{gib_ceil(placement.allocated_bytes)}Gi"
    return resources


def engine_args(target: ServingTarget) -> list[str]:
    """The engine's own flags, including the ones that hold it inside its budget."""
    spec, placement = target.spec, target.placement
    port = str(spec.service_port)
    extra = list(spec.config.extra_args)
    if spec.engine == "vllm":
        args = ["--model", spec.model, "--host", "0.0.0.0", "--port", port]
        if spec.tensor_parallel_size > 1:
            args += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
        utilization = vllm_utilization(placement)
        if utilization is not None:
            args += ["--gpu-memory-utilization", f"{utilization:.{VLLM_UTILIZATION_DIGITS}f}"]
        if spec.config.max_model_len is not None:
            args += ["--max-model-len", str(spec.config.max_model_len)]
        if spec.config.max_num_seqs is not None:
            args += ["--max-num-seqs", str(spec.config.max_num_seqs)]
        if spec.config.dtype != "auto":
            args += ["--dtype", spec.config.dtype]
        if spec.config.quantization != "auto":
            args += ["--quantization", spec.config.quantization]
        if spec.config.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", spec.config.kv_cache_dtype]
        return args + extra
    on_gpu = placement.hardware_class is not HardwareClass.CPU
    args = ["--model", spec.model, "--host", "0.0.0.0", "--port", port]
    args += ["--n-gpu-layers", "999" if on_gpu else "0"]
    if spec.config.max_model_len is not None:
        args += ["--ctx-size", str(spec.config.max_model_len)]
    if spec.config.max_num_seqs is not None:
        args += ["--parallel", str(spec.config.max_num_seqs)]
    if on_gpu and spec.tensor_parallel_size > 1:
        args += ["--split-mode", "layer"]
    return args + extra


def vllm_utilization(placement: Placement) -> float | None:
    """--gpu-memory-utilization for a shared budget: budget / device memory, rounded down.
    None on a device held whole (vLLM's own default then applies)."""
    allocation = placement.allocations[0]
    total = allocation.slot.total_bytes
    if allocation.slot.exclusive or total <= 0 or allocation.allocated_bytes >= total:
        return None
    scale = 10**VLLM_UTILIZATION_DIGITS
    utilization: float = (allocation.allocated_bytes * scale // total) / scale
    return utilization


def serving_pod(target: ServingTarget) -> dict[str, Any]:
    placement, naming = target.placement, target.naming
    resources = container_resources(placement, naming)
    env = [{"name": key, "value": value} for key, value in _visible_devices(target).items()]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": target.spec.image or target.images[target.spec.engine],
        "args": engine_args(target),
        "ports": [{"name": "http", "containerPort": target.spec.service_port}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    }
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": target.pod_name,
            "namespace": target.namespace,
            "labels": _labels(target),
            "annotations": placement_annotations(target),
            "ownerReferences": _owner(target),
        },
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": HOSTNAME_LABEL,
                                        "operator": "In",
                                        "values": [naming.hostname],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {"key": taint, "operator": "Exists", "effect": "NoSchedule"} for taint in GPU_TAINTS
            ],
            "containers": [container],
            "restartPolicy": "Always",
        },
    }


def serving_service(target: ServingTarget) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": target.service_name,
            "namespace": target.namespace,
            "labels": _labels(target),
            "ownerReferences": _owner(target),
        },
        "spec": {
            "selector": {LABEL_DEPLOYMENT: target.name},
            "ports": [{"name": "http", "port": target.spec.service_port, "targetPort": "http"}],
        },
    }


def placement_annotations(target: ServingTarget) -> dict[str, str]:
    """What the fleet view reads back: the node decided, the exact slots and bytes held."""
    placement = target.placement
    slots = [[a.slot.gpu_index, a.slot.partition_index] for a in placement.allocations]
    return {
        ANNOTATION_DEPLOYMENT: f"{target.namespace}/{target.name}",
        ANNOTATION_GENERATION: str(target.generation or 0),
        ANNOTATION_NODE: placement.node,
        ANNOTATION_SLOTS: json.dumps(slots, separators=(",", ":")),
        ANNOTATION_ALLOCATED: str(placement.allocated_bytes),
        ANNOTATION_SHARING: placement.sharing_class,
    }


def _visible_devices(target: ServingTarget) -> dict[str, str]:
    placement = target.placement
    names = VISIBLE_DEVICES.get(placement.gpu_vendor, ())
    if not target.inject_visible_devices or not target.naming.budgets or not names:
        return {}
    indices = ",".join(str(i) for i in placement.gpu_indices) or "0"
    return dict.fromkeys(names, indices)


def _labels(target: ServingTarget) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "cohabit-engine",
        "app.kubernetes.io/instance": target.name,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_DEPLOYMENT: target.name,
    }


def _owner(target: ServingTarget) -> list[dict[str, Any]]:
    if target.uid is None:
        return []
    return [
        {
            "apiVersion": crd.API_VERSION,
            "kind": crd.KIND,
            "name": target.name,
            "uid": target.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
