"""GPU memory through Dynamic Resource Allocation, on the real control plane: the slices
`kube/dra.py` publishes for a node, the claims it writes for a deployment's budget, and the
real kube-scheduler's structured allocator (consumable capacity, partitionable devices)
deciding what fits, with the resource-claim controller freeing what a deleted pod held.

The hardware is recorded NVML answers (tests/fixtures/hardware), since no GPU is here; kwok
plays the kubelets, so the pods run no container and nobody prepares the devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cohabit.hardware.model import Node
from cohabit.kube import dra
from cohabit.kube.agent import ANNOTATION_SLICES, NodeAgent, ResourceSliceAdvertiser
from cohabit.kube.cluster import KubernetesPort, NodePort
from cohabit.kube.runtime import ClusterFleetSource
from cohabit.units import GIB
from tests.cluster.conftest import Nodes, Operators, Releases
from tests.cluster.controlplane import backend_settings, install_with_api
from tests.cluster.harness import (
    GROUP_LABEL,
    Cluster,
    agent_port,
    bound_node,
    delete_model_deployment,
    deploy,
    engine_requests,
    host_and,
    no_engine_pod,
    phase,
    pod_json,
    refused,
    unschedulable_message,
    values_for,
    wait_for,
)
from tests.cluster.inventory import discovered, recording
from tests.cluster.test_placement_scheduler import delete_pod

GROUP, VERSION = "resource.k8s.io", "v1"
NO_DEVICE = "cannot allocate all claims"  # the DynamicResources plugin's Filter verdict


def ensure_device_class(api: client.ApiClient) -> None:
    """The driver's DeviceClass (cluster-wide; tests running together share it)."""
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            GROUP, VERSION, "deviceclasses", dra.device_class()
        )
    except ApiException as error:
        if error.status != 409:
            raise


@dataclass(frozen=True, slots=True, kw_only=True)
class Published:
    """A node the agent has started on: its name, the hardware it discovered, the agent."""

    name: str
    hardware: Node
    agent: NodeAgent


def publish(
    api: client.ApiClient,
    nodes: Nodes,
    short: str,
    snapshot: dict[str, Any],
    *,
    port: NodePort | None = None,
    whole_gpus: bool = False,
    capacity: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> Published:
    """A kwok node with the recorded hardware (and the extended resources `capacity`,
    `allocatable`) and the agent started on it: labelled, its slices published by the DRA
    backend through `port` (default: the admin's). No kubelet plugin: kwok's nodes have no
    kubelet to serve."""
    name = nodes.add(short, capacity=capacity, allocatable=allocatable)
    ensure_device_class(api)
    hardware = discovered(name, snapshot)
    port = port or NodePort(api)
    agent = NodeAgent(
        node_name=name,
        api=port,
        node=hardware,
        advertiser=ResourceSliceAdvertiser(port, name, hardware, whole_gpus=whole_gpus),
        whole_gpus=whole_gpus,
    )
    agent.start()
    return Published(name=name, hardware=hardware, agent=agent)


def claim_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    gib: int,
    *,
    shards: int = 1,
    selectors: Sequence[str] = (),
) -> None:
    """A claim for `gib` GiB on each of `shards` devices, and a pod using it, kept to the
    test's nodes."""
    claim = dra.memory_claim(
        name=name,
        namespace=namespace,
        shards=shards,
        bytes_per_shard=gib * GIB,
        selectors=selectors,
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", claim
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {GROUP_LABEL: namespace},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    client.CoreV1Api(api).create_namespaced_pod(namespace, pod)


def read_claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )
    return dict(found)


def allocation(api: client.ApiClient, namespace: str, name: str) -> list[dra.AllocatedDevice]:
    """Wait until the pod is bound and running; what its claim was allocated."""
    bound_node(api, namespace, name)
    return wait_for(
        lambda: dra.allocated(read_claim(api, namespace, name)),
        what=f"claim {name}'s allocation",
    )


def release(api: client.ApiClient, namespace: str, name: str) -> None:
    """Delete the pod and its claim, as the operator does when a deployment goes."""
    delete_pod(api, namespace, name)
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "resourceclaims", name
    )


def refused_pod(api: client.ApiClient, namespace: str, name: str) -> str:
    """The scheduler's refusal of the pod; its claim holds nothing meanwhile."""
    message = unschedulable_message(api, namespace, name)
    assert dra.allocated(read_claim(api, namespace, name)) == []
    return message


def kubectl_columns(cluster: Cluster, *args: str) -> list[list[str]]:
    """`kubectl get <args>` with custom columns: the rows under the header, split."""
    lines = cluster.run("kubectl", "get", *args).stdout.splitlines()
    return [line.split() for line in lines[1:]]


def test_two_six_gib_claims_share_a_t4_and_a_third_fits_once_one_goes(
    api: client.ApiClient, cluster: Cluster, namespace: str, nodes: Nodes
) -> None:
    """One 16 GB T4 (a 15 GiB device). Two 6 GiB claims share it, each its own share of
    6 GiB; a third is refused by the scheduler, holding nothing, and is allocated as soon
    as one of the two is deleted. kubectl shows the device and what each claim holds."""
    node = publish(api, nodes, "t4", recording(cards=1)).name
    shares = []
    for name in ("a", "b"):
        claim_pod(api, namespace, name, 6)
        (device,) = allocation(api, namespace, name)
        assert (device.node, device.device, device.memory_bytes) == (node, "gpu-0", 6 * GIB)
        shares.append(device.share_id)
    assert None not in shares and len(set(shares)) == 2

    claim_pod(api, namespace, "c", 6)
    assert NO_DEVICE in refused_pod(api, namespace, "c")
    # What docs/kubernetes.md shows a user with kubectl.
    assert kubectl_columns(
        cluster,
        "resourceslices",
        "--field-selector",
        f"spec.driver={dra.DRIVER},spec.nodeName={node}",
        "-o",
        "custom-columns=NODE:.spec.nodeName,DEVICES:.spec.devices[*].name,"
        "MEMORY:.spec.devices[*].capacity.memory.value",
    ) == [[node, "gpu-0", "15Gi"]]
    assert kubectl_columns(
        cluster,
        "resourceclaims",
        "-n",
        namespace,
        "-o",
        "custom-columns=CLAIM:.metadata.name,NODE:.status.allocation.devices.results[*].pool,"
        "DEVICE:.status.allocation.devices.results[*].device,"
        "HOLDS:.status.allocation.devices.results[*].consumedCapacity.memory",
    ) == [
        ["a", node, "gpu-0", "6Gi"],
        ["b", node, "gpu-0", "6Gi"],
        ["c", "<none>", "<none>", "<none>"],
    ]

    release(api, namespace, "a")
    (device,) = allocation(api, namespace, "c")
    assert (device.device, device.memory_bytes) == ("gpu-0", 6 * GIB)


def test_a_ten_gib_claim_lands_on_the_24_gib_gpu_of_a_mixed_node(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """A workstation with an 8 GB RTX 3060 Ti (gpu 0) and a 24 GB RTX 3090 (gpu 1): 10 GiB
    fits only the 3090, and a claim asking more than either card is refused."""
    publish(api, nodes, "ws", recording("nvml_workstation_3060ti_3090.json"))
    claim_pod(api, namespace, "ten", 10)
    (device,) = allocation(api, namespace, "ten")
    assert (device.device, device.memory_bytes) == ("gpu-1", 10 * GIB)
    claim_pod(api, namespace, "huge", 25)
    assert NO_DEVICE in refused_pod(api, namespace, "huge")


def test_tensor_parallel_two_gets_two_devices_of_one_node(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """TP 2 of 6 GiB: refused on a one-T4 node although its 15 GiB would hold both shards
    (each shard needs a device of its own), allocated on a two-T4 node as one share of
    each card."""
    publish(api, nodes, "one", recording(cards=1))
    claim_pod(api, namespace, "tp-one", 6, shards=2)
    assert NO_DEVICE in refused_pod(api, namespace, "tp-one")
    release(api, namespace, "tp-one")  # else it would go to the next node

    two = publish(api, nodes, "two", recording(cards=2)).name
    claim_pod(api, namespace, "tp-two", 6, shards=2)
    devices = allocation(api, namespace, "tp-two")
    assert sorted((d.node, d.device, d.memory_bytes) for d in devices) == [
        (two, "gpu-0", 6 * GIB),
        (two, "gpu-1", 6 * GIB),
    ]


def _kind(kind: str, index: int) -> str:
    return (
        f'device.attributes["{dra.DRIVER}"].kind == "{kind}" && '
        f'device.attributes["{dra.DRIVER}"].index == {index}'
    )


def test_a_whole_gpu_and_a_partition_of_it_are_never_both_granted(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """An H100 in MIG mode (gpu 0: 3g.40gb, 2g.20gb and two 1g.10gb) is offered whole and as
    its four partitions, all drawing on the card's memory counter. Lent whole, it leaves no
    partition to allocate; once it is given back the waiting partition claim is allocated,
    and then the card cannot be lent whole."""
    publish(api, nodes, "h100", recording("nvml_h100_mig_mixed.json"))
    claim_pod(api, namespace, "whole", 1, selectors=[_kind("gpu", 0)])
    (device,) = allocation(api, namespace, "whole")
    assert (device.device, device.share_id) == ("gpu-0", None)
    claim_pod(api, namespace, "part", 1, selectors=[_kind("partition", 0)])
    assert NO_DEVICE in refused_pod(api, namespace, "part")

    release(api, namespace, "whole")
    (device,) = allocation(api, namespace, "part")
    assert device.device.startswith("gpu-0-part-") and device.share_id is None
    claim_pod(api, namespace, "whole-again", 1, selectors=[_kind("gpu", 0)])
    assert NO_DEVICE in refused_pod(api, namespace, "whole-again")


def slices_of(api: client.ApiClient, node: str) -> dict[str, dict[str, Any]]:
    return {found["metadata"]["name"]: found for found in NodePort(api).node_slices(node)}


def test_the_agent_publishes_a_nodes_slices_and_publishes_them_again_when_one_is_lost(
    api: client.ApiClient, nodes: Nodes
) -> None:
    """The DRA backend of the agent on a MIG node: a slice of devices and one of counter
    sets, one pool of two slices, owned by the Node. A pass with nothing lost writes
    nothing; a slice deleted, or edited by someone else, is published again under the
    next pool generation."""
    name = nodes.add("h100")
    snapshot = recording("nvml_h100_mig_mixed.json")
    agent = ResourceSliceAdvertiser(NodePort(api), name, discovered(name, snapshot))
    agent.publish([])
    node = client.CoreV1Api(api).read_node(name)
    found = slices_of(api, name)
    assert sorted(found) == [dra.slice_name(name, "counters"), dra.slice_name(name, "devices")]
    for each in found.values():
        assert each["spec"]["pool"] == {"name": name, "generation": 1, "resourceSliceCount": 2}
        assert [o["uid"] for o in each["metadata"]["ownerReferences"]] == [node.metadata.uid]
    devices = found[dra.slice_name(name, "devices")]["spec"]["devices"]
    assert sorted(device["name"] for device in devices) == [
        "gpu-0",  # the MIG card lent whole
        *(f"gpu-0-part-{i}" for i in range(4)),
        "gpu-1",  # MIG off: shared
    ]

    node_json = NodePort(api).get_node(name)
    assert agent.reconcile(node_json) is False
    NodePort(api).delete_slice(dra.slice_name(name, "counters"))
    assert agent.reconcile(node_json) is True
    found = slices_of(api, name)
    assert {each["spec"]["pool"]["generation"] for each in found.values()} == {2}

    edited = found[dra.slice_name(name, "devices")]
    edited["metadata"]["annotations"][ANNOTATION_SLICES] = "someone-else"
    NodePort(api).put_slice(edited, version=edited["metadata"]["resourceVersion"])
    assert agent.reconcile(node_json) is True
    assert agent.reconcile(node_json) is False
    found = slices_of(api, name)
    assert {each["spec"]["pool"]["generation"] for each in found.values()} == {3}


def engine_claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """The claim the resource-claim controller made for the engine pod of `name` from the
    operator's template, once allocated."""
    pod = pod_json(api, namespace, f"{name}-engine")
    (reference,) = pod["spec"]["resourceClaims"]
    assert reference["resourceClaimTemplateName"].startswith(f"{name}-engine-")

    def made() -> str:
        statuses = pod_json(api, namespace, f"{name}-engine")["status"]
        found = statuses.get("resourceClaimStatuses") or []
        return str(found[0].get("resourceClaimName") or "") if found else ""

    claim = wait_for(made, what=f"{name}'s claim")
    return read_claim(api, namespace, claim)


DRA_VALUES = {"backend": "dra", "createDeviceClass": False, "retrySeconds": 1}


def third_placed_once_one_goes(
    api: client.ApiClient, namespace: str, message: str
) -> dra.AllocatedDevice:
    """Beside the placed `a` and `b`, a third 6 GiB deployment `c` is refused by cohabit with
    `message` before any pod of it exists, and placed once `a` is deleted: what its claim
    holds then."""
    status = deploy(api, namespace, "c", vram="6GiB")
    assert refused(status, "insufficient_capacity", permanent=False) == message
    assert no_engine_pod(api, namespace, "c")
    delete_model_deployment(api, namespace, "a")
    phase(api, namespace, "c", "DEPLOYED")
    (device,) = dra.allocated(engine_claim(api, namespace, "c"))
    return device


def test_the_operator_on_dra_shares_a_t4_and_refuses_a_third_before_any_pod(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """The chart with placement.backend dra. Two 6 GiB deployments share a T4: each engine
    pod claims 6 GiB of gpu-0 through its template, asks for no extended resource, and the
    scheduler allocates each a share. A third is refused by cohabit itself with
    insufficient_capacity before any pod of it exists, and placed once one of the two is
    deleted, its capacity freed."""
    node = publish(api, nodes, "t4", recording(cards=1)).name
    operators.start(values_for(namespace, placement=DRA_VALUES))
    for name in ("a", "b"):
        assert deploy(api, namespace, name, vram="6GiB")["phase"] == "DEPLOYED"
        assert engine_requests(api, namespace, name) == host_and({})
        (device,) = dra.allocated(engine_claim(api, namespace, name))
        assert (device.node, device.device, device.memory_bytes) == (node, "gpu-0", 6 * GIB)
        assert device.share_id is not None

    device = third_placed_once_one_goes(
        api,
        namespace,
        f"0/1 nodes fit: 1 insufficient GPU memory (largest free 3 GiB on {node} gpu 0)",
    )
    assert (device.device, device.memory_bytes) == ("gpu-0", 6 * GIB)


def test_the_agents_role_lets_it_keep_its_slices_and_read_claims(
    api: client.ApiClient, namespace: str, nodes: Nodes, releases: Releases, tmp_path: Path
) -> None:
    """The chart's agent ServiceAccount with placement.backend dra publishes its node's
    slices, puts back a deleted one and reads a claim, all as the role allows (a missing
    verb would be the API server's 403)."""
    release = releases.install(values_for(namespace, placement=DRA_VALUES))
    port = agent_port(release, tmp_path)
    node = publish(api, nodes, "t4", recording(cards=1), port=port)
    name = node.name
    assert list(slices_of(api, name)) == [dra.slice_name(name)]
    port.delete_slice(dra.slice_name(name))
    assert node.agent.tick() is True
    assert node.agent.tick() is False
    assert port.read_claim(namespace, "none") is None


def nvidia_slice(node: str, gpu_uuid: str) -> dict[str, Any]:
    """A card as NVIDIA's DRA driver publishes it: driver `gpu.nvidia.com`, device
    `gpu-<minor>` with attributes `type`, `uuid`, `productName`... and a `memory` capacity
    (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin deviceinfo.go `GetDevice` and
    partitions.go `fullGpuCapacity`). No such driver runs here: its slice is written from
    that source, and the API server validates it as it would the driver's."""
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-1",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": gpu_uuid},
                        "productName": {"string": "Tesla T4"},
                        "brand": {"string": "Nvidia"},
                        "architecture": {"string": "Turing"},
                        "cudaComputeCapability": {"version": "7.5.0"},
                    },
                    "capacity": {"memory": {"value": "15360Mi"}},
                }
            ],
        },
    }


def node_annotations(api: client.ApiClient, name: str) -> dict[str, str]:
    node = client.CoreV1Api(api).read_node(name)
    return {k: v for k, v in (node.metadata.annotations or {}).items() if "offered-by" in k}


def published_devices(api: client.ApiClient, name: str) -> list[str]:
    found = slices_of(api, name)[dra.slice_name(name)]
    return sorted(device["name"] for device in found["spec"].get("devices") or [])


def test_a_gpu_another_dra_driver_names_is_not_offered_twice(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """Two T4s; NVIDIA's DRA driver publishes the second by its UUID. The agent's next pass
    leaves gpu-1 out of our slice and says on the Node who offers it, so a second 10 GiB
    claim, which gpu-1 would hold, is refused rather than allocated on a card the other
    driver may hand out whole. Once the other slice goes, gpu-1 is published again and the
    waiting claim is allocated on it."""
    node = publish(api, nodes, "t4x2", recording(cards=2))
    name, agent = node.name, node.agent
    assert published_devices(api, name) == ["gpu-0", "gpu-1"]
    second = node.hardware.gpus[1].uuid
    assert second
    resources = client.ResourceV1Api(api)
    resources.create_resource_slice(nvidia_slice(name, second))
    try:
        assert agent.tick() is True
        assert agent.tick() is False
        assert published_devices(api, name) == ["gpu-0"]
        assert node_annotations(api, name) == {
            "cohabit.dev/gpu-1-offered-by": "DRA driver gpu.nvidia.com"
        }
        claim_pod(api, namespace, "first", 10)
        (device,) = allocation(api, namespace, "first")
        assert device.device == "gpu-0"
        claim_pod(api, namespace, "second", 10)
        assert NO_DEVICE in refused_pod(api, namespace, "second")
    finally:
        resources.delete_resource_slice(f"{name}-gpu.nvidia.com")
    assert agent.tick() is True
    assert published_devices(api, name) == ["gpu-0", "gpu-1"]
    assert node_annotations(api, name) == {}
    (device,) = allocation(api, namespace, "second")
    assert device.device == "gpu-1"


def test_a_node_whose_gpus_a_device_plugin_hands_out_publishes_none(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """A T4 node whose kubelet also offers `nvidia.com/gpu` (NVIDIA's device plugin, or one
    built on it such as HAMi's or KAI's): the device plugin may give the card to any pod, so
    our slice offers no device, the Node says why, and a claim is refused."""
    name = publish(
        api,
        nodes,
        "t4dp",
        recording(cards=1),
        capacity={"nvidia.com/gpu": "1"},
        allocatable={"nvidia.com/gpu": "1"},
    ).name
    assert published_devices(api, name) == []
    assert node_annotations(api, name) == {
        "cohabit.dev/gpu-0-offered-by": "device plugin nvidia.com/gpu"
    }
    claim_pod(api, namespace, "one", 1)
    assert NO_DEVICE in refused_pod(api, namespace, "one")


def test_the_operator_does_not_plan_on_a_gpu_another_driver_offers(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """The chart's operator on dra, beside a T4 that NVIDIA's DRA driver publishes too: the
    agent leaves it out on its next pass and says so on the Node, and cohabit refuses a
    deployment itself (the node is not schedulable, and the status says why), before any
    pod; once the other driver's slice goes the same deployment is placed on the card."""
    node = publish(api, nodes, "t4nv", recording(cards=1))
    name, agent = node.name, node.agent
    assert node.hardware.gpus[0].uuid
    resources = client.ResourceV1Api(api)
    resources.create_resource_slice(nvidia_slice(name, node.hardware.gpus[0].uuid))
    assert agent.tick() is True
    operators.start(values_for(namespace, placement=DRA_VALUES))
    status = deploy(api, namespace, "a", vram="6GiB")
    assert refused(status, "insufficient_capacity", permanent=False) == (
        "0/1 nodes fit: 1 not schedulable: its GPUs are offered by DRA driver gpu.nvidia.com"
    )
    assert no_engine_pod(api, namespace, "a")
    resources.delete_resource_slice(f"{name}-gpu.nvidia.com")
    assert agent.tick() is True
    phase(api, namespace, "a", "DEPLOYED")
    (device,) = dra.allocated(engine_claim(api, namespace, "a"))
    assert (device.node, device.device) == (name, "gpu-0")


def test_with_fractional_placement_off_each_deployment_gets_a_card_of_its_own(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """`placement.vramPluginV2.enabled: false` on dra: the agent publishes every card to be
    allocated whole (no multiple allocations), the operator plans whole cards, and the
    scheduler gives each claim a card of its own; a third deployment on two cards is
    refused by cohabit before any pod, and placed once one goes."""
    name = publish(api, nodes, "t4x2", recording(cards=2), whole_gpus=True).name
    (devices,) = slices_of(api, name).values()
    assert [d.get("allowMultipleAllocations") for d in devices["spec"]["devices"]] == [None] * 2
    operators.start(
        values_for(namespace, placement={**DRA_VALUES, "vramPluginV2": {"enabled": False}})
    )
    held = set()
    for each in ("a", "b"):
        assert deploy(api, namespace, each, vram="6GiB")["phase"] == "DEPLOYED"
        (device,) = dra.allocated(engine_claim(api, namespace, each))
        assert (device.node, device.share_id) == (name, None)
        held.add(device.device)
    assert held == {"gpu-0", "gpu-1"}

    device = third_placed_once_one_goes(
        api,
        namespace,
        f"0/1 nodes fit: 1 insufficient GPU memory (largest free 0 GiB on {name} gpu 0)",
    )
    assert device.device in held


def test_the_operator_counts_what_others_claims_hold_of_our_devices(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Someone else's pod claims 10 GiB of the T4's 15 through the DeviceClass of
    `gpu.cohabit.dev`, outside any ModelDeployment. The operator reads that claim's
    consumed capacity, so a 6 GiB deployment is refused by cohabit, before any pod, with
    the 5 GiB that is left, and a 5 GiB one is placed beside it."""
    node = publish(api, nodes, "t4", recording(cards=1)).name
    claim_pod(api, namespace, "theirs", 10)
    (device,) = allocation(api, namespace, "theirs")
    assert (device.device, device.memory_bytes) == ("gpu-0", 10 * GIB)
    operators.start(values_for(namespace, placement=DRA_VALUES))

    status = deploy(api, namespace, "big", vram="6GiB")
    assert refused(status, "insufficient_capacity", permanent=False) == (
        f"0/1 nodes fit: 1 insufficient GPU memory (largest free 5 GiB on {node} gpu 0)"
    )
    assert no_engine_pod(api, namespace, "big")
    assert deploy(api, namespace, "small", vram="5GiB")["phase"] == "DEPLOYED"
    (device,) = dra.allocated(engine_claim(api, namespace, "small"))
    assert (device.device, device.memory_bytes) == ("gpu-0", 5 * GIB)


def test_the_control_planes_fleet_is_the_device_less_others_claims(
    api: client.ApiClient,
    cluster: Cluster,
    namespace: str,
    nodes: Nodes,
    releases: Releases,
    tmp_path: Path,
) -> None:
    """`cohabit serve --backend kubernetes` on dra reads, as the chart's API account, the
    fleet its own ledger plans on: a T4's 15 GiB less the 10 GiB someone else's claim
    consumed of it."""
    node = publish(api, nodes, "t4", recording(cards=1)).name
    claim_pod(api, namespace, "theirs", 10)
    allocation(api, namespace, "theirs")
    database = f"sqlite:///{tmp_path / 'cohabit.db'}"  # read by no one: the API is not run
    release = install_with_api(releases, cluster, database, placement=DRA_VALUES)
    settings = backend_settings(release)
    assert settings.dra
    kubeconfig = release.kubeconfig("Deployment", "api", tmp_path)
    with config.new_client_from_config(str(kubeconfig)) as account:
        port = KubernetesPort(account, node_selector=settings.node_selector)
        fleet = ClusterFleetSource(port, settings)()
    (found,) = fleet.nodes
    assert (found.name, found.gpus[0].memory_bytes) == (node, 5 * GIB)


def test_a_unified_pool_is_one_device_of_the_pool_less_its_reserve(
    api: client.ApiClient, namespace: str, nodes: Nodes
) -> None:
    """A GB10 (NVML has no memory of its own for it: the pool is the host's, recorded with
    the snapshot) is one shared device, `pool`, of the pool less the OS reserve in whole
    GiB; claims share it up to that and no further."""
    snapshot = recording("nvml_gb10.json")
    hardware = discovered("gb10", snapshot)
    assert hardware.unified_memory_bytes
    capacity = (hardware.unified_memory_bytes - hardware.os_reserve_bytes) // GIB
    name = publish(api, nodes, "gb10", snapshot).name
    (device,) = slices_of(api, name)[dra.slice_name(name)]["spec"]["devices"]
    assert (device["name"], device["capacity"]["memory"]["value"]) == ("pool", f"{capacity}Gi")
    assert device["allowMultipleAllocations"] is True
    claim_pod(api, namespace, "most", capacity - 1)
    (held,) = allocation(api, namespace, "most")
    assert (held.device, held.memory_bytes) == ("pool", (capacity - 1) * GIB)
    claim_pod(api, namespace, "two", 2)
    assert NO_DEVICE in refused_pod(api, namespace, "two")
    claim_pod(api, namespace, "one", 1)
    (held,) = allocation(api, namespace, "one")
    assert held.device == "pool"


def test_a_claim_the_scheduler_cannot_allocate_is_recorded_as_insufficient_capacity(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """The node's labels say a T4, but its slice is gone and no agent puts it back: cohabit
    plans there, and the scheduler, finding no device for the engine pod's claim, leaves it
    Unschedulable. The operator records the scheduler's words as insufficient_capacity."""
    name = publish(api, nodes, "t4", recording(cards=1)).name
    NodePort(api).delete_slice(dra.slice_name(name))
    # No new try while the test looks (one would place the pod again).
    operators.start(values_for(namespace, placement={**DRA_VALUES, "retrySeconds": 600}))
    status = deploy(api, namespace, "a", vram="6GiB")
    assert (status["phase"], status["lastErrorCode"]) == ("FAILED", "NoFitError")
    # "0/N nodes": every node of the cluster counts, other tests' too.
    assert status["lastErrorMessage"].startswith("insufficient_capacity: 0/")
    assert NO_DEVICE in status["lastErrorMessage"]
    wait_for(lambda: no_engine_pod(api, namespace, "a"), what="the pod deleted")
