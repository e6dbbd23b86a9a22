"""Recorded node label sets (GPU Operator / GFD, AMD labeller, our agent) → the cluster view,
a plan, and the resources the serving pod asks for. Pure: no API server; nodes are the JSON
`kubectl get node -o json` returns, built from the fixtures."""

from __future__ import annotations

from typing import Any

import pytest

from cohabit.hardware.model import Fleet, Topology, Vendor
from cohabit.hardware.slots import slots_of
from cohabit.kube.fleetview import cluster_view, why_unschedulable, with_unschedulable_reasons
from cohabit.kube.podrequests import pod_requests
from cohabit.kube.resources import DEFAULT_ENGINE_RESOURCES, container_resources
from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.units import GIB, MIB
from tests.kube.conftest import node_object

MANAGED, STANDALONE = Topology.MANAGED_CLUSTER, Topology.STANDALONE_CLUSTER


def place(
    fixture: str, topology: Topology, vram_gib: int, *, fractional: bool = True, pods=()
) -> tuple[Placement | NoFit, Any]:
    view = cluster_view(
        [node_object(fixture)], list(pods), topology=topology, fractional=fractional
    )
    request = PlacementRequest(name="ns/model", vram_bytes=vram_gib * GIB, engine="llamacpp")
    return plan(view.state, request), view


@pytest.mark.parametrize(
    ("fixture", "topology", "fractional", "vram_gib", "expected"),
    [
        pytest.param(
            "labels_t4.json", MANAGED, True, 6,
            ("software_shared", "whole_gpu", 15360 * MIB, {"nvidia.com/gpu": "1"},
             ["SharingNotConfigured"]),
            id="t4-managed-no-sharing-is-whole-gpu",
        ),
        pytest.param(
            "labels_gpu_operator_timeslicing.json", MANAGED, True, 6,
            ("software_shared", "time_slicing_4replicas", 6 * GIB, {"nvidia.com/gpu": "1"}, []),
            id="t4-time-sliced-one-replica",
        ),
        pytest.param(
            "labels_mig_single.json", MANAGED, True, 4,
            ("hardware_isolated", "mig_1g_5gb", 4864 * MIB, {"nvidia.com/gpu": "1"}, []),
            id="mig-single-slice-is-nvidia-gpu",
        ),
        pytest.param(
            "labels_mig_mixed.json", MANAGED, True, 15,
            ("hardware_isolated", "mig_2g_20gb", 19968 * MIB, {"nvidia.com/mig-2g.20gb": "1"},
             []),
            id="mig-mixed-smallest-slice-that-fits",
        ),
        pytest.param(
            "labels_gb10.json", MANAGED, True, 6,
            ("unified_memory", "unified_memory", 6 * GIB, {"nvidia.com/gpu": "1"}, []),
            id="gb10-managed-pool",
        ),
        pytest.param(
            "labels_gb10_standalone.json", STANDALONE, True, 6,
            ("unified_memory", "unified_memory", 6 * GIB, {"cohabit.dev/vram-gb-gpu-0": "6"},
             []),
            id="gb10-standalone-budget-gpu-0",
        ),
        pytest.param(
            "labels_amd_mi300x_cpx.json", MANAGED, True, 20,
            ("hardware_isolated", "partition_cpx_nps4", 24 * GIB, {"amd.com/gpu": "1"}, []),
            id="mi300x-cpx-partition",
        ),
        pytest.param(
            "labels_cohabit_standalone.json", STANDALONE, True, 6,
            ("software_shared", "fractional", 6 * GIB, {"cohabit.dev/vram-gb-gpu-0": "6"}, []),
            id="t4-standalone-fractional-budget",
        ),
        pytest.param(
            # Our agent in whole-GPU mode: `cohabit.dev/gpu-<i>: 1`, no nvidia.com/gpu.
            "labels_t4x2_standalone_whole_gpus.json", STANDALONE, False, 6,
            ("software_shared", "whole_gpu", 15 * GIB, {"cohabit.dev/gpu-0": "1"}, []),
            id="t4-standalone-vram-plugin-off-whole-gpu",
        ),
        pytest.param(
            "labels_cpu.json", MANAGED, True, 6,
            ("cpu", "cpu", 6 * GIB, {"memory": "6Gi"}, []),
            id="cpu-node-memory-budget",
        ),
    ],
)  # fmt: skip
def test_label_fixtures_place_with_the_right_classes_budgets_and_resources(
    fixture: str, topology: Topology, fractional: bool, vram_gib: int, expected: tuple
) -> None:
    hardware_class, sharing_class, allocated, resources, notices = expected
    decision, view = place(fixture, topology, vram_gib, fractional=fractional)
    assert isinstance(decision, Placement), decision
    assert (decision.hardware_class.value, decision.sharing_class) == (
        hardware_class,
        sharing_class,
    )
    assert decision.allocated_bytes == allocated
    assert [code.value for code in decision.notices] == notices
    # Devices are asked for with requests == limits, beside the chart's host cpu/memory (a
    # CPU pool's memory is its budget, so it replaces the host memory in both).
    assert container_resources(decision, view.resources[decision.node]) == {
        "requests": {**DEFAULT_ENGINE_RESOURCES["requests"], **resources},
        "limits": {**DEFAULT_ENGINE_RESOURCES["limits"], **resources},
    }


def test_mig_pending_node_is_not_a_candidate() -> None:
    """MIG Manager evicts GPU pods while it re-partitions: the node offers nothing."""
    decision, _ = place("labels_mig_pending.json", MANAGED, 6)
    assert isinstance(decision, NoFit)
    assert decision.reason.value == "insufficient_capacity"
    assert decision.message == "0/1 nodes fit: 1 not schedulable"


def test_hostname_label_is_what_affinity_matches() -> None:
    _, view = place("labels_t4.json", MANAGED, 6)
    assert view.resources["t4-node-0"].hostname == "ip-10-0-3-17"


@pytest.mark.parametrize(
    ("allocatable_gib", "vram_gib", "placed"),
    [
        pytest.param("15", 15, True, id="whole-budget-fits"),
        pytest.param("10", 11, False, id="kubelet-allocates-less-than-the-card"),
        pytest.param("0", 1, False, id="kubelet-zeroed-the-budget"),
    ],
)
def test_standalone_capacity_is_what_the_kubelet_allocates(
    allocatable_gib: str, vram_gib: int, placed: bool
) -> None:
    node = node_object("labels_cohabit_standalone.json")
    for index in (0, 1):
        node["status"]["allocatable"][f"cohabit.dev/vram-gb-gpu-{index}"] = allocatable_gib
    view = cluster_view([node], [], topology=STANDALONE)
    decision = plan(view.state, PlacementRequest(name="m", vram_bytes=vram_gib * GIB))
    assert decision.placed is placed


def pod(node: str | None, requests: dict[str, str], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "other", **extra.pop("metadata", {})},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}]},
        "status": extra.pop("status", {"phase": "Running"}),
    }
    if node is not None:
        body["spec"]["nodeName"] = node
    return body


@pytest.mark.parametrize(
    ("fixture", "topology", "pods", "held"),
    [
        pytest.param(
            "labels_cohabit_standalone.json", STANDALONE,
            [pod("edge-t4-0", {"cohabit.dev/vram-gb-gpu-1": "10"})],
            {("edge-t4-0", 1, None): 10 * GIB},
            id="budget-request-holds-gib-on-its-gpu",
        ),
        pytest.param(
            "labels_cohabit_standalone.json", STANDALONE,
            [pod("edge-t4-0", {"cohabit.dev/vram-gb-gpu-0": "4"}, status={"phase": "Succeeded"}),
             pod(None, {"cohabit.dev/vram-gb-gpu-0": "4"})],
            {},
            id="finished-and-unbound-pods-hold-nothing",
        ),
        pytest.param(
            "labels_mig_mixed.json", MANAGED,
            [pod("h100-mixed-0", {"nvidia.com/mig-1g.10gb": "2"})],
            {("h100-mixed-0", 1, 0): 9856 * MIB, ("h100-mixed-0", 2, 0): 9856 * MIB},
            id="mig-requests-hold-whole-slices",
        ),
        pytest.param(
            "labels_gpu_operator_timeslicing.json", MANAGED,
            [pod("gke-t4-pool-7d9f", {"nvidia.com/gpu": "1"}),
             pod("gke-t4-pool-7d9f", {"nvidia.com/gpu": "1"})],
            {("gke-t4-pool-7d9f", 0, None): 2 * (15360 * MIB // 4)},
            id="time-slice-replica-holds-a-quarter-card",
        ),
        pytest.param(
            "labels_gpu_operator_no_sharing.json", MANAGED,
            [pod("l4-plain-0", {"nvidia.com/gpu": "1"})],
            {("l4-plain-0", 0, None): 23034 * MIB},
            id="whole-gpu-request-holds-the-card",
        ),
        pytest.param(
            "labels_cohabit_standalone.json", STANDALONE,
            [pod("edge-t4-0", {"cohabit.dev/vram-gb-gpu-0": "8"}, metadata={"annotations": {
                "cohabit.dev/deployment": "ns/a", "cohabit.dev/node": "edge-t4-0",
                "cohabit.dev/slots": "[[1,null]]", "cohabit.dev/allocated-bytes": str(3 * GIB),
            }})],
            {("edge-t4-0", 1, None): 3 * GIB},
            id="our-annotations-win-over-requests",
        ),
    ],
)  # fmt: skip
def test_pods_hold_budgets(
    fixture: str, topology: Topology, pods: list[dict[str, Any]], held: dict
) -> None:
    view = cluster_view([node_object(fixture)], pods, topology=topology)
    assert dict(view.state.used_bytes()) == held


def test_managed_gb10_pool_is_held_whole_by_its_one_gpu() -> None:
    """Without our budgets the pool's GPU is a single `nvidia.com/gpu`: a second deployment
    must not be planned there (the scheduler would refuse it)."""
    ours = pod("spark-01", {"nvidia.com/gpu": "1"}, metadata={"annotations": {
        "cohabit.dev/node": "spark-01", "cohabit.dev/slots": "[[null,null]]",
        "cohabit.dev/allocated-bytes": str(6 * GIB),
    }})  # fmt: skip
    decision, _ = place("labels_gb10.json", MANAGED, 6, pods=[ours])
    assert isinstance(decision, NoFit)
    assert decision.reason.value == "insufficient_system_memory"


READY = {"type": "Ready", "status": "True", "reason": "KubeletReady"}


def taint(key: str, effect: str, value: str | None = None) -> dict[str, str]:
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


@pytest.mark.parametrize(
    ("spec", "conditions", "why"),
    [
        pytest.param({}, [READY], None, id="ready"),
        pytest.param({"unschedulable": True}, [READY], "cordoned", id="cordoned"),
        pytest.param(
            {"unschedulable": True, "taints": [taint("node.kubernetes.io/unschedulable",
                                                     "NoSchedule")]},
            [READY], "cordoned", id="cordoned-and-its-taint",
        ),
        pytest.param({}, [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}],
                     "not ready (KubeletNotReady)", id="not-ready"),
        pytest.param({}, [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}],
                     "not ready (NodeStatusUnknown)", id="kubelet-stopped-posting"),
        pytest.param({}, [], "not ready", id="ready-missing"),
        pytest.param({}, [{"type": "MemoryPressure", "status": "False"}], "not ready",
                     id="only-other-conditions"),
        pytest.param({"taints": [taint("node.kubernetes.io/not-ready", "NoSchedule")]}, [READY],
                     "tainted node.kubernetes.io/not-ready:NoSchedule",
                     id="lifecycle-controller-not-ready-taint"),
        pytest.param({"taints": [taint("node.kubernetes.io/unreachable", "NoExecute")]}, [READY],
                     "tainted node.kubernetes.io/unreachable:NoExecute", id="unreachable"),
        pytest.param({"taints": [taint("dedicated", "NoSchedule", "infra")]}, [READY],
                     "tainted dedicated=infra:NoSchedule", id="someone-elses-taint"),
        pytest.param({"taints": [taint("dedicated", "PreferNoSchedule", "infra")]}, [READY],
                     None, id="prefer-no-schedule-only-steers"),
        # The GPU operators' taints, which keep other pods off GPU nodes; ours tolerate them.
        pytest.param({"taints": [taint("nvidia.com/gpu", "NoSchedule", "present")]}, [READY],
                     None, id="gke-nvidia-gpu-taint-tolerated"),
        pytest.param({"taints": [taint("amd.com/gpu", "NoSchedule")]}, [READY], None,
                     id="amd-gpu-taint-tolerated"),
        pytest.param({"taints": [taint("nvidia.com/gpu", "NoExecute", "present")]}, [READY],
                     "tainted nvidia.com/gpu=present:NoExecute",
                     id="gpu-taint-no-execute-not-tolerated"),
    ],
)  # fmt: skip
def test_why_unschedulable(
    spec: dict[str, Any], conditions: list[dict[str, str]], why: str | None
) -> None:
    """Why the kube-scheduler would bind none of our pods (its NodeUnschedulable and
    TaintToleration filters; Ready read as the node lifecycle controller reads it), for
    the tolerations our engine pods carry (`TOLERATED_TAINTS`, NoSchedule only)."""
    node = {"metadata": {"name": "n"}, "spec": spec, "status": {"conditions": conditions}}
    assert why_unschedulable(node) == why


CORDONED = {"unschedulable": True}
NOT_READY = {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}


def node_in(fixture: str, name: str, state: dict[str, Any]) -> dict[str, Any]:
    """The recorded node named `name`, cordoned (`CORDONED`), not Ready (`NOT_READY`) or
    as recorded (`{}`)."""
    node = node_object(fixture)
    node["metadata"] = {**node["metadata"], "name": name}
    node["metadata"]["labels"] = {**node["metadata"]["labels"], "kubernetes.io/hostname": name}
    if state.get("unschedulable"):
        node["spec"] = {"unschedulable": True}
    if "conditions" in state:
        node["status"] = {**node["status"], "conditions": state["conditions"]}
    return node


@pytest.mark.parametrize(
    ("nodes", "vram_gib", "message"),
    [
        pytest.param([("labels_t4.json", CORDONED)], 6,
                     "0/1 nodes fit: 1 not schedulable: cordoned", id="cordoned"),
        pytest.param([("labels_t4.json", CORDONED), ("labels_t4.json", CORDONED)], 6,
                     "0/2 nodes fit: 2 not schedulable: cordoned", id="both-cordoned"),
        pytest.param([("labels_mig_pending.json", {})], 6,
                     "0/1 nodes fit: 1 not schedulable: MIG reconfiguration pending"
                     " (nvidia.com/mig.config.state=pending)",
                     id="mig-pending"),
        pytest.param([("labels_t4.json", CORDONED), ("labels_t4.json", NOT_READY),
                      ("labels_t4.json", CORDONED)], 6,
                     "0/3 nodes fit: 3 not schedulable (2 cordoned, 1 not ready (KubeletNotReady))",
                     id="reasons-differ"),
        pytest.param([("labels_t4.json", CORDONED), ("labels_t4.json", {})], 20,
                     "0/2 nodes fit: 1 insufficient GPU memory (largest free 15 GiB on n1 gpu 0),"
                     " 1 not schedulable: cordoned", id="beside-a-full-node"),
        # The cordoned AMD node is turned down as another vendor's first: its reason is not
        # the T4's, so neither is named.
        pytest.param([("labels_t4.json", CORDONED), ("labels_amd_mi300x_cpx.json", CORDONED)], 6,
                     "0/2 nodes fit: 1 not schedulable, 1 vendor mismatch",
                     id="one-counted-under-another-reason"),
    ],
)  # fmt: skip
def test_a_no_fit_says_why_its_nodes_are_not_schedulable(
    nodes: list[tuple[str, dict[str, Any]]], vram_gib: int, message: str
) -> None:
    """The operator's NoFit names why nodes are not schedulable (one reason, or how many of
    each), as the ModelDeployment's status shows it."""
    view = cluster_view(
        [node_in(fixture, f"n{i}", state) for i, (fixture, state) in enumerate(nodes)],
        [],
        topology=MANAGED,
    )
    request = PlacementRequest(
        name="ns/model", vram_bytes=vram_gib * GIB, engine="vllm", vendor=Vendor.NVIDIA
    )
    decision = plan(view.state, request)
    assert isinstance(decision, NoFit)
    assert with_unschedulable_reasons(decision, view.state.fleet).message == message


def capacities_mib(fleet: Fleet) -> dict[int, int]:
    """How many slots of each capacity (MiB) a fleet offers."""
    counts: dict[int, int] = {}
    for slot in slots_of(fleet):
        counts[slot.capacity_bytes // MIB] = counts.get(slot.capacity_bytes // MIB, 0) + 1
    return counts


@pytest.mark.parametrize(
    ("fixture", "allocatable", "offered"),
    [
        pytest.param("labels_gpu_operator_no_sharing.json", {}, {23034: 2}, id="l4-both-healthy"),
        pytest.param("labels_gpu_operator_no_sharing.json", {"nvidia.com/gpu": "1"},
                     {23034: 1, 0: 1}, id="l4-one-unhealthy"),
        pytest.param("labels_t4.json", {"nvidia.com/gpu": "0"}, {0: 1},
                     id="plugin-not-registered-yet"),
        pytest.param("labels_gpu_operator_timeslicing.json", {"nvidia.com/gpu": "0"}, {0: 1},
                     id="time-sliced-card-unhealthy"),
        pytest.param("labels_gpu_operator_mps.json", {"nvidia.com/gpu": "10"},
                     {23034: 1, 0: 1}, id="mps-one-card-of-two-unhealthy"),
        pytest.param("labels_mig_mixed.json", {"nvidia.com/mig-1g.10gb": "1"},
                     {81559: 1, 9856: 1, 19968: 1, 40192: 1, 0: 1}, id="mig-mixed-one-slice"),
        pytest.param("labels_mig_single_h100.json", {"nvidia.com/gpu": "1"},
                     {40192: 1, 0: 1}, id="mig-single-one-slice"),
        pytest.param("labels_gb10.json", {"nvidia.com/gpu": "0"}, {0: 1},
                     id="gb10-pool-without-its-gpu"),
        pytest.param("labels_amd_mi300x_cpx.json", {}, {24576: 64}, id="mi300x-all-healthy"),
    ],
)  # fmt: skip
def test_vendor_devices_are_offered_as_far_as_the_kubelet_allocates_them(
    fixture: str, allocatable: dict[str, str], offered: dict[int, int]
) -> None:
    """Unhealthy devices leave the kubelet's allocatable but not the labels: only what is
    allocatable is offered now, while the hardware as built (what "can this ever fit" asks)
    keeps every device."""
    node = node_object(fixture)
    node["status"]["allocatable"].update(allocatable)
    view = cluster_view([node], [], topology=MANAGED)
    assert capacities_mib(view.state.fleet) == offered
    healthy = cluster_view([node_object(fixture)], [], topology=MANAGED)
    assert capacities_mib(view.hardware) == capacities_mib(healthy.hardware)


def container(resources: dict[str, str], **more: Any) -> dict[str, Any]:
    return {"resources": {"requests": resources, "limits": resources}, **more}


@pytest.mark.parametrize(
    ("spec", "counted"),
    [
        pytest.param(
            {"containers": [{"resources": {"limits": {"cohabit.dev/vram-gb-gpu-0": "3"}}},
                            {"resources": {"requests": {"cohabit.dev/vram-gb-gpu-0": "2",
                                                        "cpu": "500m"}}}]},
            {"cohabit.dev/vram-gb-gpu-0": "5", "cpu": "500m"},
            id="containers-summed-limits-stand-for-requests",
        ),
        pytest.param(
            {"initContainers": [container({"cohabit.dev/vram-gb-gpu-0": "10"})],
             "containers": [container({"cohabit.dev/vram-gb-gpu-0": "4"})]},
            {"cohabit.dev/vram-gb-gpu-0": "10"},
            id="a-larger-init-container-counts",
        ),
        pytest.param(
            {"initContainers": [
                container({"cohabit.dev/vram-gb-gpu-0": "2"}, restartPolicy="Always"),
                container({"cohabit.dev/vram-gb-gpu-0": "10"})],
             "containers": [container({"cohabit.dev/vram-gb-gpu-0": "1"})]},
            {"cohabit.dev/vram-gb-gpu-0": "12"},
            id="a-sidecar-runs-beside-the-init-containers-after-it",
        ),
        pytest.param(
            {"initContainers": [
                container({"cohabit.dev/vram-gb-gpu-0": "10"}),
                container({"cohabit.dev/vram-gb-gpu-0": "2"}, restartPolicy="Always")],
             "containers": [container({"cohabit.dev/vram-gb-gpu-0": "1"})]},
            {"cohabit.dev/vram-gb-gpu-0": "10"},
            id="a-sidecar-after-the-init-container",
        ),
        pytest.param(
            {"initContainers": [
                container({"nvidia.com/mig-1g.10gb": "1"}, restartPolicy="Always")],
             "containers": [container({"nvidia.com/mig-1g.10gb": "1"})]},
            {"nvidia.com/mig-1g.10gb": "2"},
            id="sidecar-devices-add-to-the-containers",
        ),
        pytest.param(
            {"containers": [container({"cpu": "2"})], "overhead": {"cpu": "1"}},
            {"cpu": "3"},
            id="runtime-class-overhead-adds",
        ),
    ],
)  # fmt: skip
def test_pod_requests_count_what_the_scheduler_counts(
    spec: dict[str, Any], counted: dict[str, str]
) -> None:
    """k8s.io/component-helpers resource.PodRequests, which noderesources/fit.go sums."""
    assert pod_requests({"spec": spec}) == counted


def test_a_node_is_read_again_when_its_version_changes_and_not_before() -> None:
    """Nodes are read once per uid and resourceVersion (the API server gives every write a
    new one): a cordon written as a new version is seen at once; the same version, even
    if a caller changed the dict, is the node as first read."""
    raw = node_object("labels_cohabit_standalone.json")
    raw["metadata"].update(uid="0d5c2a4e-node", resourceVersion="41")
    first = cluster_view([raw], [], topology=STANDALONE).state.fleet.nodes[0]
    assert first.schedulable

    cordoned = {**raw, "spec": {"unschedulable": True}}
    same_version = cluster_view([cordoned], [], topology=STANDALONE).state.fleet.nodes[0]
    assert same_version is first

    cordoned["metadata"] = {**raw["metadata"], "resourceVersion": "42"}
    written = cluster_view([cordoned], [], topology=STANDALONE).state.fleet.nodes[0]
    assert (written.schedulable, written.unschedulable_reason) == (False, "cordoned")

    unversioned = {**cordoned, "metadata": {"name": raw["metadata"]["name"]}}
    unversioned["spec"] = {}
    read_afresh = cluster_view([unversioned], [], topology=STANDALONE).state.fleet.nodes[0]
    assert read_afresh.schedulable


def test_on_dra_a_gpu_another_driver_offers_offers_nothing() -> None:
    """The agent's DRA backend left a GPU out of its slices and said who offers it
    (`cohabit.dev/gpu-<i>-offered-by`): placement counts that card as empty of room, and a
    node with every card so taken as not schedulable, naming who has them."""
    node = node_object("labels_workstation_3060ti_3090_standalone.json")
    node["metadata"]["annotations"] = {"cohabit.dev/gpu-1-offered-by": "DRA driver gpu.nvidia.com"}
    view = cluster_view([node], [], topology=STANDALONE, dra=True)
    decision = plan(view.state, PlacementRequest(name="m", vram_bytes=10 * GIB))
    assert isinstance(decision, NoFit)
    assert decision.largest_free_location == f"{node['metadata']['name']} gpu 0"
    assert plan(view.state, PlacementRequest(name="m", vram_bytes=7 * GIB)).placed

    node["metadata"]["annotations"]["cohabit.dev/gpu-0-offered-by"] = "device plugin nvidia.com/gpu"
    view = cluster_view([node], [], topology=STANDALONE, dra=True)
    (built,) = view.state.fleet.nodes
    assert (built.schedulable, built.unschedulable_reason) == (
        False,
        "its GPUs are offered by DRA driver gpu.nvidia.com, device plugin nvidia.com/gpu",
    )
    # The same annotations mean nothing on the extended-resources backend.
    view = cluster_view([node], [], topology=STANDALONE)
    assert plan(view.state, PlacementRequest(name="m", vram_bytes=10 * GIB)).placed


def allocated_claim(name: str, node: str, device: str, memory: str | None, owner: str = "") -> dict:
    """A ResourceClaim as the API server returns it once the scheduler allocated it (the
    fields of k8s.io/api resource/v1 `DeviceRequestAllocationResult`)."""
    result: dict[str, Any] = {"request": "gpu", "driver": "gpu.cohabit.dev", "pool": node}
    result["device"] = device
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
        result["shareID"] = "7d3c1e4a-0b2f-4c6d-9e8a-1f2b3c4d5e6f"
    meta: dict[str, Any] = {"name": name, "namespace": "team"}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": owner}]
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": [result]}}}}


def test_on_dra_claims_others_made_hold_what_they_consumed_and_ours_are_not_counted_twice() -> None:
    node = node_object("labels_workstation_3060ti_3090_standalone.json")
    name = node["metadata"]["name"]
    ours = {
        "metadata": {
            "name": "m-engine",
            "namespace": "team",
            "uid": "uid-ours",
            "annotations": {
                "cohabit.dev/deployment": "team/m",
                "cohabit.dev/node": name,
                "cohabit.dev/slots": "[[1,null]]",
                "cohabit.dev/allocated-bytes": str(4 * GIB),
            },
        },
        "spec": {"nodeName": name},
        "status": {"phase": "Running"},
    }
    claims = [
        allocated_claim("theirs", name, "gpu-1", "10Gi"),
        allocated_claim("m-engine-gpu-x", name, "gpu-1", "4Gi", owner="uid-ours"),
        allocated_claim("whole", name, "gpu-0", None),
        allocated_claim("elsewhere", "another-node", "gpu-0", "1Gi"),
    ]
    view = cluster_view([node], [ours], topology=STANDALONE, dra=True, claims=claims)
    held = sorted((r.deployment, r.gpu_index, r.reserved_bytes) for r in view.state.reservations)
    assert held == [
        ("team/m", 1, 4 * GIB),
        ("team/theirs", 1, 10 * GIB),
        ("team/whole", 0, 8 * GIB),
    ]
    decision = plan(view.state, PlacementRequest(name="n", vram_bytes=11 * GIB))
    assert isinstance(decision, NoFit)
    assert decision.largest_free_bytes == 10 * GIB  # 24 GiB less 10 theirs, less 4 ours
