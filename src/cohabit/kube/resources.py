"""The serving Pod and Service for one placed ModelDeployment: pure builders of wire JSON.

The pod is pinned with node affinity on `kubernetes.io/hostname`, never `spec.nodeName`, so
the kube-scheduler still checks the budget; it asks for exactly what the placement holds
(requests == limits, integers only): `cohabit.dev/vram-gb-gpu-<i>: N` GiB per shard, one
`cohabit.dev/gpu-<i>` per device in whole-GPU mode, one MIG / AMD partition, or whole
vendor GPUs. A bare Pod rather than a Deployment: the operator is the controller, and a lost
pod must go back through the planner, not be recreated blindly.

The engine's command line and environment come from the same launcher as a local process
(`runtime.engines.launch.build_launch`); only where it listens, the program's path in the
image and the model path inside the pod differ. This module adds the Kubernetes side: the
image for the engine and vendor, the volumes, and which devices the container sees.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cohabit.estimate.shape import ModelShape
from cohabit.hardware.labels import OUR_GPU_RESOURCE
from cohabit.hardware.labels import OUR_VRAM_RESOURCE as BUDGET_RESOURCE
from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.kube import crd, dra
from cohabit.kube.errors import InvalidSpec
from cohabit.kube.fleetview import (
    ANNOTATION_ALLOCATED,
    ANNOTATION_DEPLOYMENT,
    ANNOTATION_GENERATION,
    ANNOTATION_NODE,
    ANNOTATION_SHARING,
    ANNOTATION_SLOTS,
    HOSTNAME_LABEL,
    TOLERATED_TAINTS,
    NodeResources,
)
from cohabit.kube.modelstorage import pod_storage
from cohabit.kube.startqueue import ANNOTATION_QUEUED, START_GATE
from cohabit.placement.decision import Placement
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import ANY_HOST, HardLimit, LaunchSpec, LaunchTarget
from cohabit.runtime.errors import LaunchError
from cohabit.runtime.interface import LaunchRequest
from cohabit.units import gib_ceil

LABEL_DEPLOYMENT = "cohabit.dev/model-deployment"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "cohabit"
CONTAINER = "engine"
CPU_IMAGE_KEY = "cpu"
# Engine image per engine and per vendor of the placed devices ("cpu": a CPU pool). The
# chart's `engines.images` replaces these; the tags are the projects' own (values.yaml).
DEFAULT_IMAGES: Mapping[str, Mapping[str, str]] = {
    "vllm": {"nvidia": "vllm/vllm-openai:v0.18.0", "amd": "vllm/vllm-openai-rocm:v0.18.0"},
    "llamacpp": {
        "nvidia": "ghcr.io/ggml-org/llama.cpp:server-cuda",
        "amd": "ghcr.io/ggml-org/llama.cpp:server-rocm",
        CPU_IMAGE_KEY: "ghcr.io/ggml-org/llama.cpp:server",
    },
}
DEFAULT_DOWNLOADER_IMAGE = "vllm/vllm-openai:v0.18.0"
# The engine's program inside those images: llama.cpp's server images run
# /app/llama-server (.devops/*.Dockerfile, ENTRYPOINT); the vLLM images have `vllm` on PATH
# (their entrypoint is `vllm serve`). The pod sets the whole command, entrypoint included.
PROGRAMS: Mapping[str, str] = {"vllm": "vllm", "llamacpp": "/app/llama-server"}
# What each vendor's runtime reads to pick devices (NVIDIA's container runtime reads
# NVIDIA_VISIBLE_DEVICES; CUDA and HIP read theirs inside the process).
VISIBLE_DEVICES: Mapping[Vendor, tuple[str, ...]] = {
    Vendor.NVIDIA: ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    Vendor.AMD: ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
}
HAMI_VOLUME = "hami-core"
HAMI_CACHE = "/tmp/cohabit-hami-{name}.cache"  # the pod's own /tmp
# Host CPU and memory for an engine beside its device budget (the chart's
# `engines.resources`): without them the pod is BestEffort, the first evicted under memory
# pressure, and refused outright in a namespace whose ResourceQuota counts cpu or memory.
DEFAULT_ENGINE_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "1", "memory": "4Gi"},
    "limits": {"memory": "32Gi"},
}
# The user engine pods run as (the chart's `runAsUser`); None on OpenShift, whose
# restricted-v2 SCC assigns one from the namespace's range and refuses any other.
DEFAULT_RUN_AS_USER = 65532
# Engines write caches under $HOME (vLLM: ~/.cache/vllm, vllm/envs.py VLLM_CACHE_ROOT;
# huggingface_hub: ~/.cache/huggingface, constants.py HF_HOME); an image built to run as
# root has no home the pod's user may write, so HOME is the pod's /tmp.
ENGINE_HOME = "/tmp"
# What Pod Security's `restricted` profile requires of every container
# (k8s.io/pod-security-admission policy/check_*.go): no privilege escalation, every
# capability dropped, a non-root user, the runtime's default seccomp profile.
CONTAINER_SECURITY: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingTarget:
    """One ModelDeployment, placed: what the builders need and nothing else.

    `launch`: the launch request the operator rebuilt from the spec (its settings and, when
    carried, the admission estimate) on this placement. `shape`: the GGUF's metadata when
    known, so llama.cpp's layers and context fit as they would locally.
    `inject_visible_devices`: the status-patch budget backend, which has no device plugin
    `Allocate`, so the pod itself names its GPUs to the container runtime.
    `hard_limit_library`: HAMi-core's library on the node (the chart's `enforce`).
    """

    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: crd.ModelDeploymentSpec
    placement: Placement
    naming: NodeResources
    launch: LaunchRequest
    shape: ModelShape | None = None
    inject_visible_devices: bool = False
    images: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: DEFAULT_IMAGES)
    downloader_image: str = DEFAULT_DOWNLOADER_IMAGE
    hard_limit_library: str | None = None
    host_resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: DEFAULT_ENGINE_RESOURCES
    )
    run_as_user: int | None = DEFAULT_RUN_AS_USER

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
        if slot.hardware_class is HardwareClass.CPU or naming.dra:  # dra: the pod's claim
            continue
        if slot.kind is SlotKind.PARTITION and slot.partition_profile is not None:
            name = naming.partition_resources.get(slot.partition_profile)
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
            continue
        index = 0 if slot.kind is SlotKind.POOL else slot.gpu_index or 0
        if naming.budgets:
            name = BUDGET_RESOURCE.format(index=index)
            counts[name] = counts.get(name, 0) + gib_ceil(allocation.allocated_bytes)
            continue
        if naming.whole_gpus:
            counts[OUR_GPU_RESOURCE.format(index=index)] = 1
            continue
        if naming.whole_gpu_resource is not None:
            counts[naming.whole_gpu_resource] = counts.get(naming.whole_gpu_resource, 0) + 1
    return {name: str(count) for name, count in counts.items()}


def container_resources(
    placement: Placement,
    naming: NodeResources,
    host: Mapping[str, Mapping[str, str]] = DEFAULT_ENGINE_RESOURCES,
) -> dict[str, dict[str, str]]:
    """The engine container's requests and limits: its devices (requests == limits), the
    host CPU and memory of `host`, and on a CPU pool the memory budget itself as both
    (the kube-scheduler then enforces it like a GPU budget)."""
    devices = device_requests(placement, naming)
    requests = {**dict(host.get("requests") or {}), **devices}
    limits = {**dict(host.get("limits") or {}), **devices}
    if placement.hardware_class is HardwareClass.CPU:
        requests["memory"] = limits["memory"] = f"{gib_ceil(placement.allocated_bytes)}Gi"
    return {"requests": requests, "limits": limits}


def engine_launch(target: ServingTarget) -> LaunchSpec:
    """The engine's command and environment from the shared launcher, as the pod runs it:
    listening on every interface at the service port, the image's program, the model where
    the pod mounts it, devices named by the pod (not the launcher's host view)."""
    spec = target.spec
    storage = pod_storage(spec, downloader_image=target.downloader_image)
    hard_limit = None
    if target.hard_limit_library is not None and target.placement.gpu_vendor is Vendor.NVIDIA:
        hard_limit = HardLimit(
            library=target.hard_limit_library, shared_cache=HAMI_CACHE.format(name=target.name)
        )
    where = LaunchTarget(
        port=spec.service_port,
        host=ANY_HOST,
        executable=PROGRAMS[spec.engine],
        model_path=storage.model_path,
        device_env=False,
        hard_limit=hard_limit,
    )
    try:
        return build_launch(target.launch, where, shape=target.shape)
    except LaunchError as error:
        raise InvalidSpec(f"ModelDeployment {target.namespace}/{target.name}: {error}") from None


def container_devices(target: ServingTarget) -> dict[str, str]:
    """The visible-devices variables as the container sees its devices.

    Whatever hands the pod its GPUs (our device plugin's CDI devices, a vendor plugin, or
    with the status-patch backend the NVIDIA runtime reading NVIDIA_VISIBLE_DEVICES from
    the pod) puts only those devices in the container, numbered from 0: host GPU 1 is
    ordinal 0 there. NVIDIA GPUs our agent hands out are named by UUID when known (the
    same inside and out); a vendor plugin picks its own card, so ordinals. Memory pools
    (CPU, unified) need nothing.
    """
    placement = target.placement
    vendor = placement.gpu_vendor
    slots = [a.slot for a in placement.allocations]
    names = VISIBLE_DEVICES.get(vendor)
    if names is None or slots[0].kind is SlotKind.POOL:
        return {}
    ours = target.naming.budgets or target.naming.whole_gpus
    uuids = [slot.gpu_uuid for slot in slots if slot.kind is SlotKind.GPU]
    env: dict[str, str] = {}
    if vendor is Vendor.NVIDIA:
        by_uuid = ours and len(uuids) == len(slots) and all(uuids)
        if target.inject_visible_devices and ours:
            host = [slot.gpu_uuid or str(slot.gpu_index) for slot in slots]
            env[names[0]] = ",".join(host)
        inside = [str(u) for u in uuids] if by_uuid else [str(i) for i in range(len(slots))]
        env[names[1]] = ",".join(inside)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        return env
    return dict.fromkeys(names, ",".join(str(i) for i in range(len(slots))))


def engine_image(target: ServingTarget) -> str:
    """`spec.image`, else the chart's image for the engine and the placed vendor."""
    if target.spec.image:
        return target.spec.image
    placement = target.placement
    key = (
        CPU_IMAGE_KEY
        if placement.hardware_class is HardwareClass.CPU
        else placement.gpu_vendor.value
    )
    image = target.images.get(target.spec.engine, {}).get(key)
    if image is None:
        raise InvalidSpec(
            f"ModelDeployment {target.namespace}/{target.name}: no {target.spec.engine} image "
            f"for {key} devices (set spec.image or the chart's engines.images)"
        )
    return image


def serving_pod(
    target: ServingTarget, *, queued_at: str | None = None, gated: bool = False
) -> dict[str, Any]:
    """The engine pod. `gated`: created with the start gate (another engine is starting on
    its devices; see `startqueue`), `queued_at` ordering it among those waiting."""
    placement, naming = target.placement, target.naming
    launch = engine_launch(target)
    storage = pod_storage(target.spec, downloader_image=target.downloader_image)
    env = {"HOME": ENGINE_HOME, **launch.env, **container_devices(target)}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": engine_image(target),
        "command": list(launch.argv),
        "ports": [{"name": "http", "containerPort": target.spec.service_port}],
        "resources": container_resources(placement, naming, target.host_resources),
        "securityContext": dict(CONTAINER_SECURITY),
        "readinessProbe": {
            "httpGet": {"path": urlsplit(launch.health_url).path, "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
    }
    if env:
        container["env"] = [{"name": key, "value": value} for key, value in sorted(env.items())]
    volumes = list(storage.volumes)
    mounts = list(storage.mounts)
    if launch.env.get("LD_PRELOAD") and target.hard_limit_library:
        library = target.hard_limit_library
        volumes.append({"name": HAMI_VOLUME, "hostPath": {"path": library, "type": "File"}})
        mounts.append({"name": HAMI_VOLUME, "mountPath": library, "readOnly": True})
    if mounts:
        container["volumeMounts"] = mounts
    annotations = placement_annotations(target)
    if queued_at is not None:
        annotations[ANNOTATION_QUEUED] = queued_at
    pod_spec: dict[str, Any] = {
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
            {"key": taint, "operator": "Exists", "effect": "NoSchedule"}
            for taint in TOLERATED_TAINTS
        ],
        "containers": [container],
        "restartPolicy": "Always",
        "securityContext": pod_security(target.run_as_user),
    }
    if storage.init_containers:
        # The engine's host cpu and memory, no devices: a compute quota refuses a pod any
        # of whose containers asks for none, and an init container's requests count only
        # where they exceed the containers' (the pod's effective request is the larger).
        host = {
            kind: {name: value for name, value in amounts.items() if "/" not in name}
            for kind, amounts in container["resources"].items()
        }
        pod_spec["initContainers"] = [
            {
                **init,
                "env": [{"name": "HOME", "value": ENGINE_HOME}, *(init.get("env") or [])],
                "resources": host,
                "securityContext": dict(CONTAINER_SECURITY),
            }
            for init in storage.init_containers
        ]
    if volumes:
        pod_spec["volumes"] = volumes
    if gated:
        pod_spec["schedulingGates"] = [{"name": START_GATE}]
    template = claim_template(target)
    if template is not None:
        name = template["metadata"]["name"]
        pod_spec["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": name}]
        container["resources"]["claims"] = [{"name": CLAIM}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": target.pod_name,
            "namespace": target.namespace,
            "labels": _labels(target),
            "annotations": annotations,
            "ownerReferences": _owner(target),
        },
        "spec": pod_spec,
    }


def pod_security(run_as_user: int | None) -> dict[str, Any]:
    """The pod's securityContext under Pod Security `restricted`: non-root, the runtime's
    seccomp profile, and the user `run_as_user` (unset: the platform assigns one)."""
    security: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_user is not None:
        security["runAsUser"] = run_as_user
    return security


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


CLAIM = "gpu"  # the pod's name for its claim (spec.resourceClaims, resources.claims)


def claim_template(target: ServingTarget) -> dict[str, Any] | None:
    """On a node whose devices are ResourceSlices (`naming.dra`): the ResourceClaimTemplate
    the pod's claim is made from, asking each allocation's bytes of the device the plan
    chose; None elsewhere. The resource-claim controller makes the pod's claim from it and
    deletes the claim with the pod. Its name carries a digest of its spec (a template's spec
    cannot change), so another placement is another template; all go with the
    ModelDeployment, which owns them."""
    if not target.naming.dra:
        return None
    shards = [(a.slot, a.allocated_bytes) for a in target.placement.allocations]
    spec = dra.pinned_claim_spec(shards)
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"{target.pod_name}-{digest}",
            "namespace": target.namespace,
            "labels": _labels(target),
            "ownerReferences": _owner(target),
        },
        "spec": {"metadata": {"labels": _labels(target)}, "spec": spec},
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
