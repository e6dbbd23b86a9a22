"""The cluster as placement sees it: nodes (labels + allocatable, via
`hardware.node_labels.node_from_labels`) minus the requests of the pods that hold budgets there.

The operator calls `cluster_view()` with the API server's JSON before every decision; nothing
here talks to a cluster. `node_measurements()` reads what the node agents measured (memory
in use, and held outside cohabit) from the same nodes. Budgets are whole GiB on the wire
(`cohabit.dev/vram-gb-gpu-<i>`), so on nodes our agent serves the capacity placement may use
is what the kubelet allocates now (zero while it has zeroed our resource), never the label's
larger MiB figure; a vendor's devices count as far as the kubelet allocates them (its healthy
ones). A pod holds what the kube-scheduler counts it as holding (`pod_requests`).
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from cohabit.hardware import labels as node_labels
from cohabit.hardware.model import Fleet, Gpu, Node, Topology, Vendor
from cohabit.hardware.slots import Slot, SlotKey, SlotKind
from cohabit.hardware.usage import DeviceUsage
from cohabit.kube import dra
from cohabit.kube.nodememory import ANNOTATION_MEMORY, ReportError, report_from_annotation
from cohabit.kube.podrequests import pod_requests
from cohabit.placement.reasons import FilterCode, NoFit
from cohabit.placement.state import FleetState, Reservation
from cohabit.units import GIB, gib_floor

HOSTNAME_LABEL = "kubernetes.io/hostname"
# Our pods say what they hold, so a time-sliced share or a pinned GPU is counted exactly.
ANNOTATION_DEPLOYMENT = "cohabit.dev/deployment"
ANNOTATION_NODE = "cohabit.dev/node"
ANNOTATION_SLOTS = "cohabit.dev/slots"  # JSON [[gpu_index, partition_index], ...]
ANNOTATION_ALLOCATED = "cohabit.dev/allocated-bytes"  # per slot
ANNOTATION_GENERATION = "cohabit.dev/generation"  # the ModelDeployment generation it serves
ANNOTATION_SHARING = "cohabit.dev/sharing-class"  # read back when the scheduler refuses it
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Taints our engine pods tolerate (a GPU operator's, which keep other pods off GPU nodes);
# a node with any other NoSchedule or NoExecute taint is not planned onto, as the
# kube-scheduler would not bind our pod there.
TOLERATED_TAINTS = ("nvidia.com/gpu", "amd.com/gpu")
_REPELLING = frozenset({"NoSchedule", "NoExecute"})
_BUDGET_RESOURCE = re.compile(r"^cohabit\.dev/vram-gb-gpu-(?P<index>\d+)$")
_WHOLE_RESOURCE = re.compile(r"^cohabit\.dev/gpu-(?P<index>\d+)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeResources:
    """How to ask the kube-scheduler for a device on one node.

    `budgets`: our agent publishes `cohabit.dev/vram-gb-gpu-<i>` there (fractional GiB).
    `dra`: our agent publishes the node's devices as ResourceSlices (`dra.py`); a pod asks
    for them through a ResourceClaimTemplate, and no extended resource.
    `whole_gpus`: our agent publishes `cohabit.dev/gpu-<i>` there, one per device
    (a standalone cluster with fractional placement off).
    `whole_gpu_resource`: the vendor's per-device resource (`nvidia.com/gpu`,
    `nvidia.com/gpu.shared`, `amd.com/gpu`). `partition_resources`: profile → resource name
    (`1g.10gb` → `nvidia.com/mig-1g.10gb` under mig.strategy=mixed, `nvidia.com/gpu` under
    single). `hostname`: the node's `kubernetes.io/hostname` label, what affinity matches.
    """

    node: str
    hostname: str
    budgets: bool = False
    dra: bool = False
    whole_gpus: bool = False
    whole_gpu_resource: str | None = None
    partition_resources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """A fleet state to plan against, plus per-node resource naming for the pod.

    `hardware`: the same nodes as built, every one schedulable and at its full size (not
    what the kubelet allocates this minute): what "can this ever fit" is asked against.
    """

    state: FleetState
    resources: Mapping[str, NodeResources]
    hardware: Fleet


class ViewSettings(Protocol):
    """The settings a view is read with (the operator's and the control plane's)."""

    @property
    def topology(self) -> Topology: ...

    @property
    def fractional(self) -> bool: ...

    @property
    def dra(self) -> bool: ...


def view_for(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    settings: ViewSettings,
    claims: Sequence[Mapping[str, Any]] = (),
) -> ClusterView:
    """`cluster_view` as `settings` read it."""
    return cluster_view(
        nodes,
        pods,
        topology=settings.topology,
        fractional=settings.fractional,
        dra=settings.dra,
        claims=claims,
    )


def cluster_view(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    *,
    topology: Topology,
    fractional: bool = True,
    dra: bool = False,
    claims: Sequence[Mapping[str, Any]] = (),
) -> ClusterView:
    """Plan input from `GET /api/v1/nodes` and `GET /api/v1/pods` items (wire JSON).
    `dra`: our agents publish ResourceSlices rather than extended resources, and `claims`
    (`GET .../resourceclaims` items) say what else holds part of them
    (`reservations_from_claims`).

    Cordoned nodes stay in the fleet, unschedulable, so a NoFit can say why.
    """
    fleet_nodes: list[Node] = []
    built: list[Node] = []
    naming: dict[str, NodeResources] = {}
    for raw in nodes:
        node, hardware, resources = _read_node_version(
            raw, topology=topology, fractional=fractional, dra=dra
        )
        fleet_nodes.append(node)
        built.append(hardware)
        naming[node.name] = resources
    fleet = Fleet(topology=topology, fractional=fractional, nodes=tuple(fleet_nodes))
    state = FleetState(fleet=fleet)
    held = reservations_from_pods(pods, state, naming) + reservations_from_claims(
        claims, pods, state
    )
    return ClusterView(
        state=state.with_reservations(held),
        resources=naming,
        hardware=replace(fleet, nodes=tuple(built)),
    )


_ReadNode = tuple[Node, Node, NodeResources]
_READ: dict[tuple[str, Topology, bool, bool], tuple[str, _ReadNode]] = {}
_READ_KEPT = 8192  # nodes remembered (a cluster's, at each topology read)


def _read_node_version(
    raw: Mapping[str, Any], *, topology: Topology, fractional: bool, dra: bool
) -> _ReadNode:
    """`_read_node`, remembered per node version. Reading labels is most of what a view of
    a large cluster costs, the operator builds one per decision, and nodes rarely change;
    the API server gives every write to a node a new resourceVersion, so one uid and version
    is one content. A new version that reads the same (a heartbeat, a memory report) gives
    back the objects read before, so what is derived from them (`slots_of`) is reused too.
    A node without uid and version (not from an API server) is read every time."""
    meta = raw.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if not uid or not version:
        return _read_node(raw, topology=topology, fractional=fractional, dra=dra)
    key = (str(uid), topology, fractional, dra)
    kept = _READ.get(key)
    if kept is not None and kept[0] == str(version):
        return kept[1]
    found = _read_node(raw, topology=topology, fractional=fractional, dra=dra)
    if kept is not None and kept[1] == found:
        found = kept[1]
    if len(_READ) >= _READ_KEPT:
        _READ.clear()
    _READ[key] = (str(version), found)
    return found


def _read_node(
    raw: Mapping[str, Any], *, topology: Topology, fractional: bool, dra: bool
) -> _ReadNode:
    """The node as placement may use it now, the node as built, and its resource names."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    name = str(meta.get("name", ""))
    labels: Mapping[str, str] = meta.get("labels") or {}
    allocatable: Mapping[str, str] = status.get("allocatable") or {}
    capacity: Mapping[str, str] = status.get("capacity") or {}
    ours = node_labels.OUR_VENDOR in labels and topology is Topology.STANDALONE_CLUSTER
    if not ours:
        # A managed cluster has no agent of ours: read the vendor's labels only.
        labels = {k: v for k, v in labels.items() if not k.startswith("cohabit.dev/")}
    node = node_labels.node_from_labels(
        name,
        labels,
        allocatable=allocatable,
        memory_capacity=capacity.get("memory"),
        annotations=(meta.get("annotations") or {}) if ours else None,
    )
    on_slices = ours and dra and bool(node.gpus)
    budgets = ours and fractional and bool(node.gpus) and not on_slices
    whole_gpus = ours and not fractional and bool(node.gpus) and not on_slices
    resources = NodeResources(
        node=name,
        hostname=str(labels.get(HOSTNAME_LABEL) or name),
        budgets=budgets,
        dra=on_slices,
        whole_gpus=whole_gpus,
        whole_gpu_resource=_whole_gpu_resource(node, allocatable),
        partition_resources=_partition_resources(node, labels, allocatable),
    )
    hardware = replace(node, schedulable=True, unschedulable_reason=None)
    if on_slices:
        node = _whole_gib(node, _offered_elsewhere(node, meta.get("annotations") or {}))
    elif budgets:
        node = _capped_to_allocatable(node, allocatable)
    elif whole_gpus:
        node = _whole_gpus_allocatable(node, allocatable)
    else:
        node = _vendor_allocatable(node, resources, allocatable)
    why = why_unschedulable(raw)
    if why is not None:
        node = replace(node, schedulable=False, unschedulable_reason=why)
    return node, hardware, resources


def why_unschedulable(raw: Mapping[str, Any]) -> str | None:
    """Why the kube-scheduler would bind none of our pods to this node now, or None: it is
    cordoned, its kubelet does not report Ready, or it carries a taint our pods do not
    tolerate (the node lifecycle controller's unreachable taint among them)."""
    spec = raw.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    # Not ready before the taints: the node lifecycle controller taints a node that is not
    # ready a moment after it says so, and the reason must not depend on that moment.
    conditions = (raw.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "True":
        return "not ready" + (f" ({ready['reason']})" if ready and ready.get("reason") else "")
    for taint in spec.get("taints") or []:
        key = str(taint.get("key", ""))
        effect = taint.get("effect")
        tolerated = key in TOLERATED_TAINTS and effect == "NoSchedule"
        if effect in _REPELLING and not tolerated:
            value = taint.get("value")
            return f"tainted {key}{'=' + str(value) if value else ''}:{effect}"
    return None


def with_unschedulable_reasons(no_fit: NoFit, fleet: Fleet) -> NoFit:
    """`no_fit` saying why its not-schedulable nodes are so ("cordoned", "its GPUs are
    offered by DRA driver gpu.nvidia.com"), read from the fleet it was planned on. Only when
    those nodes are all the planner counted so: one it turned down before (another vendor)
    is counted under that reason, and the sentence must not name it twice."""
    counted = no_fit.node_reasons.get(FilterCode.UNSCHEDULABLE, 0)
    why = Counter(node.unschedulable_reason for node in fleet.nodes if not node.schedulable)
    if not counted or sum(why.values()) != counted or None in why:
        return no_fit
    return replace(no_fit, unschedulable={str(reason): n for reason, n in why.items()})


def _capped_to_allocatable(node: Node, allocatable: Mapping[str, str]) -> Node:
    """Capacity = the budget the kubelet allocates now: the scheduler enforces that figure,
    and it is zero while the kubelet has zeroed our resource (the agent re-publishes it)."""

    def budget_bytes(index: int) -> int:
        text = str(allocatable.get(node_labels.OUR_VRAM_RESOURCE.format(index=index), "0")).strip()
        return int(text) * GIB if text.isdigit() else 0

    if node.is_unified:
        return replace(node, unified_memory_bytes=budget_bytes(0) + node.os_reserve_bytes)
    gpus = tuple(
        replace(gpu, memory_bytes=min(gpu.memory_bytes or 0, budget_bytes(gpu.index)))
        for gpu in node.gpus
    )
    return replace(node, gpus=gpus)


def _offered_elsewhere(node: Node, annotations: Mapping[str, str]) -> dict[int, str]:
    """The node's GPUs our agent left out of its slices, and who else offers each."""
    found = {}
    for gpu in node.gpus:
        who = annotations.get(node_labels.OUR_GPU_OFFERED_BY.format(index=gpu.index))
        if who:
            found[gpu.index] = who
    return found


def _whole_gib(node: Node, withdrawn: Mapping[int, str]) -> Node:
    """What the node's ResourceSlices offer (`dra.node_slices`): each GPU's memory and the
    pool's (less the OS reserve) in whole GiB, as the allocator counts it. A GPU in
    `withdrawn` (left out: something else offers it) offers nothing, nor does a unified pool
    with such a GPU; a node with all its GPUs withdrawn is unschedulable, saying who has
    them."""
    if node.schedulable and withdrawn and set(withdrawn) >= {gpu.index for gpu in node.gpus}:
        who = ", ".join(sorted(set(withdrawn.values())))
        node = replace(
            node, schedulable=False, unschedulable_reason=f"its GPUs are offered by {who}"
        )
    if node.is_unified:
        pool = gib_floor(max(0, (node.unified_memory_bytes or 0) - node.os_reserve_bytes))
        if withdrawn:
            pool = 0
        return replace(node, unified_memory_bytes=pool * GIB + node.os_reserve_bytes)
    gpus = tuple(
        replace(gpu, memory_bytes=0, partitions=())
        if gpu.index in withdrawn
        else gpu
        if gpu.partitions
        else replace(gpu, memory_bytes=gib_floor(gpu.memory_bytes or 0) * GIB)
        for gpu in node.gpus
    )
    return replace(node, gpus=gpus)


def _whole_gpus_allocatable(node: Node, allocatable: Mapping[str, str]) -> Node:
    """Whole-GPU mode: a device is there while the kubelet allocates its one unit (zero
    after a restart until the agent publishes it again), else it has no memory to offer."""

    def offered(index: int) -> bool:
        text = str(allocatable.get(node_labels.OUR_GPU_RESOURCE.format(index=index), "0"))
        return text.strip().isdigit() and int(text) >= 1

    if node.is_unified:
        return node if offered(0) else replace(node, unified_memory_bytes=node.os_reserve_bytes)
    gpus = tuple(gpu if offered(gpu.index) else replace(gpu, memory_bytes=0) for gpu in node.gpus)
    return replace(node, gpus=gpus)


def _vendor_allocatable(node: Node, naming: NodeResources, allocatable: Mapping[str, str]) -> Node:
    """The devices a vendor's device plugin hands out now. The kubelet's allocatable counts
    its healthy devices only, while its capacity and the vendor's labels count every one
    (pkg/kubelet/cm/devicemanager/manager.go, GetCapacity), and it is zero until the plugin
    has registered: a device past what is allocatable offers nothing, as the scheduler would
    bind no pod to it. Labels do not say which device is unhealthy, so the last of each
    resource go; a pod asks for a resource, never a device, so which ones does not matter.

    A card shared by time-slicing or MPS takes its replicas' worth of units; a MIG slice or
    AMD partition one unit of its profile's resource; a unified pool one unit per GPU.
    """
    left: dict[str, int] = {}

    def take(resource: str | None, units: int) -> bool:
        if resource is None:
            return False
        if resource not in left:
            text = str(allocatable.get(resource, "0")).strip()
            left[resource] = int(text) if text.isdigit() else 0
        if left[resource] < units:
            return False
        left[resource] -= units
        return True

    if not node.gpus:
        return node
    if node.is_unified:
        if take(naming.whole_gpu_resource, len(node.gpus)):
            return node
        return replace(node, unified_memory_bytes=node.os_reserve_bytes)
    replicas = (node.sharing_replicas or 1) if node.sharing_strategy is not None else 1
    gpus: list[Gpu] = []
    for gpu in node.gpus:
        if gpu.partitions:
            parts = tuple(
                part
                if take(naming.partition_resources.get(part.profile), 1)
                else replace(part, memory_bytes=0)
                for part in gpu.partitions
            )
            gpus.append(replace(gpu, partitions=parts))
        elif take(naming.whole_gpu_resource, replicas):
            gpus.append(gpu)
        else:
            gpus.append(replace(gpu, memory_bytes=0))
    return replace(node, gpus=tuple(gpus))


def _whole_gpu_resource(node: Node, allocatable: Mapping[str, str]) -> str | None:
    if not node.gpus:
        return None
    vendor = node.gpus[0].vendor
    if vendor is Vendor.NVIDIA:
        shared = node_labels.NV_SHARED_RESOURCE
        if shared in allocatable and node_labels.NV_GPU_RESOURCE not in allocatable:
            return shared
        return node_labels.NV_GPU_RESOURCE
    if vendor is Vendor.AMD:
        return node_labels.AMD_GPU_RESOURCE
    return None


def _partition_resources(
    node: Node, labels: Mapping[str, str], allocatable: Mapping[str, str]
) -> dict[str, str]:
    """Profile → the resource that hands out one such partition on this node."""
    names: dict[str, str] = {}
    mig_single = (labels.get(node_labels.NV_MIG_STRATEGY) or "").lower() == "single"
    for gpu in node.gpus:
        for part in gpu.partitions:
            if gpu.vendor is Vendor.NVIDIA:
                names[part.profile] = (
                    node_labels.NV_GPU_RESOURCE if mig_single else f"nvidia.com/mig-{part.profile}"
                )
            elif f"amd.com/{part.profile}" in allocatable:  # the labeller's "mixed" naming
                names[part.profile] = f"amd.com/{part.profile}"
            else:
                names[part.profile] = node_labels.AMD_GPU_RESOURCE
    return names


def reservations_from_pods(
    pods: Sequence[Mapping[str, Any]],
    state: FleetState,
    naming: Mapping[str, NodeResources],
) -> tuple[Reservation, ...]:
    """What the pods on each node hold, as reservations.

    A pod holds budget while it is not finished and has a node (bound, or ours and still
    pending: we decided where it goes). Our pods' annotations name their slots and bytes;
    anyone else's are read from their requests as the scheduler counts them
    (`pod_requests`): `vram-gb-gpu-<i>` GiB, one MIG /
    AMD partition per unit, and one whole card per unit of the vendor's GPU resource (a
    time-sliced replica counts as the card's memory divided by its replicas).
    """
    slots_by_node: dict[str, list[Slot]] = {}
    for slot in state.slots:
        slots_by_node.setdefault(slot.node, []).append(slot)
    # Nodes whose one unified pool is held whole by whoever holds its vendor resource.
    pools = {
        node: pool
        for node, slots in slots_by_node.items()
        if (pool := next((s for s in slots if s.kind is SlotKind.POOL), None)) is not None
        and pool.vendor is not Vendor.CPU
        and not ((resources := naming.get(node)) and resources.budgets)
    }
    held: dict[SlotKey, int] = {}
    reservations: list[Reservation] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        spec = pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            continue
        node = spec.get("nodeName") or annotations.get(ANNOTATION_NODE)
        if not node or node not in slots_by_node:
            continue
        owner = annotations.get(ANNOTATION_DEPLOYMENT) or (
            f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        )
        slots = slots_by_node[node]
        found = _annotated(annotations, node, owner) or _from_requests(
            pod_requests(pod), slots, naming.get(node), held, owner
        )
        pool = pools.get(node)
        if pool is not None:
            # Without our budgets a unified pool's GPU is one vendor resource: who holds it
            # holds the pool.
            found = [replace(r, reserved_bytes=pool.capacity_bytes) for r in found]
        for reservation in found:
            held[reservation.slot_key] = held.get(reservation.slot_key, 0) + 1
        reservations.extend(found)
    return tuple(reservations)


def reservations_from_claims(
    claims: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    state: FleetState,
) -> tuple[Reservation, ...]:
    """What ResourceClaims allocated on our driver's devices hold, as reservations, but for
    the claims of our own pods (the resource-claim controller makes a pod's claim owned by
    the pod), which `reservations_from_pods` counts from the pods' annotations: a claim
    someone else made on a `gpu.cohabit.dev` device holds its consumed memory of that
    device, or the whole device when it took it whole; a card of partitions taken whole
    holds every partition. A claim holds until the scheduler deallocates it, deleted or
    not, as the scheduler counts it. Held under "namespace/name" of the claim."""
    if not claims:
        return ()
    ours = {
        str((pod.get("metadata") or {}).get("uid"))
        for pod in pods
        if ANNOTATION_DEPLOYMENT in ((pod.get("metadata") or {}).get("annotations") or {})
    }
    slots_by_node: dict[str, list[Slot]] = {}
    for slot in state.slots:
        slots_by_node.setdefault(slot.node, []).append(slot)
    found: list[Reservation] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        owners = {
            str(reference.get("uid"))
            for reference in meta.get("ownerReferences") or []
            if reference.get("kind") == "Pod"
        }
        if owners & ours:
            continue
        holder = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for device in dra.allocated(claim):
            named = dra.device_slot(device.device)
            slots = slots_by_node.get(device.node) or []
            if named is None or not slots:
                continue
            for slot in _device_slots(slots, *named):
                size = device.memory_bytes
                if size is None or slot.kind is SlotKind.PARTITION:
                    size = slot.capacity_bytes
                found.append(_held_on(slot, holder, size))
    return tuple(found)


def _held_on(slot: Slot, owner: str, size: int) -> Reservation:
    return Reservation(
        deployment=owner,
        node=slot.node,
        gpu_index=slot.gpu_index,
        partition_index=slot.partition_index,
        reserved_bytes=size,
    )


def _device_slots(slots: Sequence[Slot], gpu: int | None, part: int | None) -> list[Slot]:
    """The slots one published device is: the pool, a GPU, a partition, or every
    partition of a card taken whole."""
    if gpu is None:
        return [slot for slot in slots if slot.kind is SlotKind.POOL]
    if part is not None:
        return [s for s in slots if (s.gpu_index, s.partition_index) == (gpu, part)]
    card = [s for s in slots if s.gpu_index == gpu and s.kind is SlotKind.GPU]
    return card or [s for s in slots if s.gpu_index == gpu and s.kind is SlotKind.PARTITION]


def _annotated(annotations: Mapping[str, str], node: str, owner: str) -> list[Reservation]:
    raw_slots, raw_bytes = annotations.get(ANNOTATION_SLOTS), annotations.get(ANNOTATION_ALLOCATED)
    if raw_slots is None or raw_bytes is None or not raw_bytes.isdigit():
        return []
    return list(_reservations(raw_slots, int(raw_bytes), node, owner))


@functools.lru_cache(maxsize=16384)
def _reservations(raw_slots: str, size: int, node: str, owner: str) -> tuple[Reservation, ...]:
    """Our pod's slots annotation read as reservations of `size` bytes each: the same few
    strings for every decision while the pod lives, so read once (a thousand pods a
    decision otherwise)."""
    try:
        keys = [(pair[0], pair[1]) for pair in json.loads(raw_slots)]
    except (ValueError, TypeError, IndexError, KeyError):
        return ()
    return tuple(
        Reservation(
            deployment=owner, node=node, gpu_index=gpu, partition_index=part, reserved_bytes=size
        )
        for gpu, part in keys
    )


def _from_requests(
    requests: Mapping[str, str],
    slots: list[Slot],
    naming: NodeResources | None,
    held: Mapping[SlotKey, int],
    owner: str,
) -> list[Reservation]:
    found: list[Reservation] = []

    def take(slot: Slot, size: int) -> None:
        found.append(_held_on(slot, owner, size))

    def free_slots(match: list[Slot], count: int) -> list[Slot]:
        """Exclusive slots nobody holds; shared ones (time-sliced) least held first."""
        taken = {r.slot_key for r in found}
        open_ = [s for s in match if s.key not in taken and not (s.exclusive and held.get(s.key))]
        return sorted(open_, key=lambda s: (held.get(s.key, 0), s.position))[:count]

    pool = next((s for s in slots if s.kind is SlotKind.POOL), None)
    for name, value in requests.items():
        if not value.isdigit() or int(value) == 0:
            continue
        count = int(value)
        budget = _BUDGET_RESOURCE.match(name)
        if budget is not None:
            index = int(budget["index"])
            target = pool if pool is not None else _gpu_slot(slots, index)
            if target is not None:
                take(target, count * GIB)
            continue
        whole = _WHOLE_RESOURCE.match(name)
        if whole is not None:
            target = pool if pool is not None else _gpu_slot(slots, int(whole["index"]))
            if target is not None:
                take(target, target.capacity_bytes)
            continue
        profile = _profile_for(name, naming)
        if profile is not None:
            partitions = [s for s in slots if s.partition_profile == profile]
            for slot in free_slots(partitions, count):
                take(slot, slot.capacity_bytes)
            continue
        if naming is not None and name == naming.whole_gpu_resource:
            if pool is not None:
                take(pool, pool.capacity_bytes)
                continue
            gpus = [s for s in slots if s.kind is SlotKind.GPU]
            for slot in free_slots(gpus, count):
                take(slot, slot.capacity_bytes // _replicas(slot))
    return found


def _gpu_slot(slots: list[Slot], index: int) -> Slot | None:
    return next((s for s in slots if s.kind is SlotKind.GPU and s.gpu_index == index), None)


def _profile_for(resource: str, naming: NodeResources | None) -> str | None:
    if naming is None:
        return None
    for profile, name in naming.partition_resources.items():
        if name == resource:
            return profile
    return None


def _replicas(slot: Slot) -> int:
    """Time-sliced cards are handed out as replicas; one replica's share of the memory."""
    match = re.fullmatch(r"time_slicing_(\d+)replicas", slot.sharing_class)
    return max(1, int(match.group(1))) if match else 1


def node_measurements(
    nodes: Sequence[Mapping[str, Any]], *, now: datetime
) -> tuple[list[DeviceUsage], dict[str, str]]:
    """The devices our node agents last reported (`cohabit.dev/memory`), each with what
    cohabit's engine pods use there — whole GPUs and pools; slices are not used yet — and per
    node whose report is not used, why (stale, or unreadable). The meter turns them into the
    planner's `Measurement`."""
    devices: list[DeviceUsage] = []
    problems: dict[str, str] = {}
    for raw in nodes:
        meta = raw.get("metadata") or {}
        name = str(meta.get("name", ""))
        text = (meta.get("annotations") or {}).get(ANNOTATION_MEMORY)
        if text is None:
            continue
        try:
            report = report_from_annotation(str(text), node=name)
        except ReportError as err:
            problems[name] = f"its {ANNOTATION_MEMORY} annotation is unreadable: {err}"
            continue
        if report.stale(now):
            problems[name] = (
                f"its memory report is {report.age_s(now):.0f} s old (stale after "
                f"{report.stale_after_s:.0f} s): is the node agent running?"
            )
            continue
        # A slice's figures stay out: the cluster view reads MIG devices and AMD partitions
        # from the vendor's labels, which do not say which card holds which slice, so the
        # agent's (card, slice) indices need not name the same slot there.
        devices.extend(d for d in report.devices if d.partition_index is None)
    return devices, problems


def topology_of(mode: str) -> Topology:
    """`managed` | `standalone` (the Helm value) → the topology placement uses."""
    return Topology.MANAGED_CLUSTER if mode == "managed" else Topology.STANDALONE_CLUSTER


def pinned_state(
    state: FleetState, *, node: str, slots: Sequence[tuple[int | None, int | None]]
) -> FleetState:
    """`state` narrowed to a pinned placement: only `node` and, on it, only the pinned GPUs
    (other partitions of a pinned GPU are kept at zero size so partition indices stay). The
    planner then either places on exactly those slots or says why they no longer fit.
    `slots`: (gpu index, partition index) pairs; none, or (None, None), means the pool."""
    found = next((n for n in state.fleet.nodes if n.name == node), None)
    nodes: tuple[Node, ...] = ()
    if found is not None:
        wanted: dict[int, set[int]] = {}
        for gpu_index, partition_index in slots:
            if gpu_index is not None:
                parts = wanted.setdefault(gpu_index, set())
                if partition_index is not None:
                    parts.add(partition_index)
        if wanted:
            gpus = []
            for gpu in found.gpus:
                if gpu.index not in wanted:
                    continue
                parts = wanted[gpu.index]
                if parts and gpu.partitions:
                    gpu = replace(
                        gpu,
                        partitions=tuple(
                            p if i in parts else replace(p, memory_bytes=0)
                            for i, p in enumerate(gpu.partitions)
                        ),
                    )
                gpus.append(gpu)
            found = replace(found, gpus=tuple(gpus))
        nodes = (found,)
    return FleetState(fleet=replace(state.fleet, nodes=nodes), reservations=state.reservations)


def fleet_less_held(state: FleetState, *, keep: Collection[str]) -> Fleet:
    """The fleet with what others hold taken off each slot's memory: the hardware a control
    plane with its own ledger plans against. `keep`: the holders that ledger already counts
    (our ModelDeployments, "namespace/name"), left out so nothing is counted twice. An
    exclusive slot someone else holds ends at zero bytes, so it fits nothing."""
    held: dict[SlotKey, int] = {}
    for reservation in state.reservations:
        if reservation.deployment not in keep:
            key = reservation.slot_key
            held[key] = held.get(key, 0) + reservation.reserved_bytes

    def less(size: int, key: SlotKey) -> int:
        return max(0, size - held.get(key, 0))

    def less_known(size: int | None, key: SlotKey) -> int | None:
        return None if size is None else less(size, key)

    nodes: list[Node] = []
    for node in state.fleet.nodes:
        pool = (node.name, None, None)
        if node.is_unified:
            node = replace(node, unified_memory_bytes=less_known(node.unified_memory_bytes, pool))
        elif node.is_cpu_only:
            node = replace(node, memory_bytes=less_known(node.memory_bytes, pool))
        else:
            gpus = []
            for gpu in node.gpus:
                if gpu.partitions:
                    parts = tuple(
                        replace(p, memory_bytes=less(p.memory_bytes, (node.name, gpu.index, i)))
                        for i, p in enumerate(gpu.partitions)
                    )
                    gpus.append(replace(gpu, partitions=parts))
                else:
                    key = (node.name, gpu.index, None)
                    gpus.append(replace(gpu, memory_bytes=less_known(gpu.memory_bytes, key)))
            node = replace(node, gpus=tuple(gpus))
        nodes.append(node)
    return replace(state.fleet, nodes=tuple(nodes))
