"""Placement on every reference hardware shape, end to end through the real control plane.

Layers: the chart installed with the real `helm install`; its operator run here as the
chart's own ServiceAccount (`Operators`); ModelDeployments created through the real API
server; engine pods bound, or refused, by the real kube-scheduler against the node's
allocatable (pkg/scheduler/framework/plugins/noderesources/fit.go). Nodes are kwok's: real
Node objects shaped like recorded ones (tests/fixtures/kube, tests/fixtures/hardware), with
the labels the GPU Operator, AMD's labeller or our agent put there; kwok only stands in for
the kubelet, so no container runs and a bound pod is reported Running and Ready at once.

Each test has its own namespace and nodes; the chart's placement.nodeSelector keeps its
operator on them, so "0/N nodes" below counts the test's own nodes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from cohabit.kube.cluster import KubernetesPort
from cohabit.units import GIB
from tests.cluster.conftest import Nodes, Operators
from tests.cluster.harness import (
    MANAGED,
    MODEL,
    SETTLED,
    Cluster,
    deploy,
    engine_requests,
    host_and,
    model_deployment,
    no_engine_pod,
    phase,
    pod_json,
    refused,
    served_on,
    status_of,
    values_for,
    wait_for,
)

WHOLE_GPU = {"placement": {"vramPluginV2": {"enabled": False}}}
# What our agent labels a node without GPUs with (labels.labels_for_node).
CPU_AGENT_LABELS = {"cohabit.dev/gpu-vendor": "cpu"}


# --- tensor parallelism ----------------------------------------------------------------------


def test_tensor_parallel_two_lands_two_budgets_on_one_node(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Beside a one-GPU node, the two-GPU node takes both shards: one pod holding a budget
    on each card, bound there by the scheduler."""
    nodes.recorded("labels_t4_standalone.json", "t4")
    pair = nodes.recorded("labels_cohabit_standalone.json", "t4x2")
    operators.start(values_for(namespace))
    status = deploy(api, namespace, "tp2", vram="6GiB", tensorParallelSize=2)
    assert status["phase"] == "DEPLOYED", status
    assert (status["node"], status["gpuIndices"]) == (pair, [0, 1])
    assert served_on(api, namespace, "tp2") == pair
    assert engine_requests(api, namespace, "tp2") == host_and(
        {"cohabit.dev/vram-gb-gpu-0": "6", "cohabit.dev/vram-gb-gpu-1": "6"}
    )


def test_tensor_parallel_two_is_refused_where_no_node_has_two_gpus(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Two GPUs in the cluster, one per node: shards never span nodes, so it never fits."""
    first = nodes.recorded("labels_t4_standalone.json", "t4-a")
    nodes.recorded("labels_t4_standalone.json", "t4-b")
    operators.start(values_for(namespace))
    status = deploy(api, namespace, "tp2", vram="6GiB", tensorParallelSize=2)
    message = refused(status, "insufficient_gpu_count", permanent=True)
    # Ties go to the first node in the API server's order (by name).
    assert (
        message == f"0/2 nodes fit: 2 insufficient GPU count (largest free 15 GiB on {first} gpu 0)"
    )
    assert no_engine_pod(api, namespace, "tp2")


# --- hardware partitions -----------------------------------------------------------------------

# (requested GiB, expected): a partition profile and the resource its pod asks for one of,
# None for a whole card, or the NoFit reason and whether it is final.
Step = tuple[int, tuple[str | None, str] | tuple[str, bool]]


@pytest.mark.parametrize(
    ("fixture", "steps"),
    [
        pytest.param(
            # GPU 0 cut into 2 x 1g.10gb, 2g.20gb and 3g.40gb; GPU 1 whole, no sharing.
            "labels_mig_mixed.json",
            [
                (9, ("1g.10gb", "nvidia.com/mig-1g.10gb")),
                (9, ("1g.10gb", "nvidia.com/mig-1g.10gb")),
                (9, ("2g.20gb", "nvidia.com/mig-2g.20gb")),
                (9, ("3g.40gb", "nvidia.com/mig-3g.40gb")),
                (9, (None, "nvidia.com/gpu")),
                (9, ("sharing_not_configured", False)),
            ],
            id="h100-mig-mixed",
        ),
        pytest.param(
            # Two 3g.40gb slices, each one nvidia.com/gpu.
            "labels_mig_single_h100.json",
            [
                (45, ("insufficient_capacity", True)),
                (30, ("3g.40gb", "nvidia.com/gpu")),
                (30, ("3g.40gb", "nvidia.com/gpu")),
                (30, ("insufficient_capacity", False)),
            ],
            id="h100-mig-single",
        ),
        pytest.param(
            # 8 x MI300X in CPX/NPS4: 64 partitions of 24 GiB, each one amd.com/gpu.
            "labels_amd_mi300x_cpx.json",
            [
                (30, ("insufficient_capacity", True)),
                (20, ("cpx_nps4", "amd.com/gpu")),
                (20, ("cpx_nps4", "amd.com/gpu")),
            ],
            id="mi300x-cpx",
        ),
    ],
)
def test_partitions_hold_one_model_each_the_smallest_that_fits(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    fixture: str,
    steps: list[Step],
) -> None:
    """Managed cluster (the GPU Operator's or AMD's labels): each model takes one partition
    of its own, the smallest that holds it; taken ones are never offered again, and the
    scheduler binds each pod asking for one unit of that partition's resource."""
    node = nodes.recorded(fixture, "gpu")
    operators.start(values_for(namespace, **MANAGED))
    taken: set[tuple[int, ...]] = set()
    for number, (vram_gib, expected) in enumerate(steps):
        name = f"m{number}"
        status = deploy(api, namespace, name, vram=f"{vram_gib}GiB")
        if isinstance(expected[1], bool):
            refused(status, str(expected[0]), permanent=expected[1])
            assert no_engine_pod(api, namespace, name)
            continue
        profile, resource = expected
        assert status["phase"] == "DEPLOYED", status
        assert (status["node"], status.get("partition")) == (node, profile)
        if profile is None:  # a whole card on a cluster without sharing
            assert status["notices"] == ["SharingNotConfigured"], status
        slot = tuple(status["gpuIndices"])
        assert slot not in taken, f"{name} placed on a taken slot {slot}"
        taken.add(slot)
        assert served_on(api, namespace, name) == node
        assert engine_requests(api, namespace, name) == host_and({resource: "1"})


# --- memory pools and mixed cards ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "values", "devices"),
    [
        pytest.param(
            # Our agent's budget: floor(124609 MiB pool - 8 GiB) = 113 GiB.
            "labels_gb10_standalone.json", {}, {"cohabit.dev/vram-gb-gpu-0": "113"},
            id="gb10-standalone-budget",
        ),
        pytest.param(
            # GFD has no memory label on GB10: the pool is status.capacity.memory, 121.7 GiB.
            "labels_gb10.json", MANAGED, {"nvidia.com/gpu": "1"},
            id="gb10-managed-gpu-operator",
        ),
    ],
)  # fmt: skip
def test_unified_pool_keeps_its_os_reserve(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    fixture: str,
    values: dict[str, Any],
    devices: dict[str, str],
) -> None:
    """DGX Spark: 114 GiB fits the 121.7 GiB pool but not the pool less its 8 GiB OS
    reserve, so it is refused for good; 113 GiB is placed on the pool and bound."""
    node = nodes.recorded(fixture, "spark")
    operators.start(values_for(namespace, **values))
    status = deploy(api, namespace, "too-big", vram="114GiB")
    message = refused(status, "insufficient_system_memory", permanent=True)
    assert message.startswith("0/1 nodes fit: 1 insufficient system memory (largest free 113")
    assert no_engine_pod(api, namespace, "too-big")
    status = deploy(api, namespace, "fits", vram="113GiB")
    assert status["phase"] == "DEPLOYED", status
    assert (status["node"], status["hardwareClass"]) == (node, "unified_memory")
    assert status["allocatedBytes"] == 113 * GIB
    assert served_on(api, namespace, "fits") == node
    assert engine_requests(api, namespace, "fits") == host_and(devices)


def test_mixed_workstation_puts_10_gib_on_the_24_gb_card(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """8 GB + 24 GB cards, both idle: 10 GiB fits only the 3090's budget (gpu 1), and 20
    GiB more then fits neither card's free budget (8 and 14 GiB)."""
    node = nodes.recorded("labels_workstation_3060ti_3090_standalone.json", "ws")
    operators.start(values_for(namespace))
    status = deploy(api, namespace, "ten", vram="10GiB")
    assert status["phase"] == "DEPLOYED", status
    assert (status["node"], status["gpuIndices"]) == (node, [1])
    assert served_on(api, namespace, "ten") == node
    assert engine_requests(api, namespace, "ten") == host_and({"cohabit.dev/vram-gb-gpu-1": "10"})
    message = refused(deploy(api, namespace, "twenty", vram="20GiB"), "insufficient_capacity",
                      permanent=False)  # fmt: skip
    assert (
        message == f"0/1 nodes fit: 1 insufficient GPU memory (largest free 14 GiB on {node} gpu 1)"
    )


def test_whole_gpu_mode_gives_each_model_a_card_of_its_own(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """Fractional placement off (our agent advertises `cohabit.dev/gpu-<i>: 1`): two small
    models take the two cards, a third finds no card free."""
    node = nodes.recorded("labels_t4x2_standalone_whole_gpus.json", "t4x2")
    operators.start(values_for(namespace, **WHOLE_GPU))
    cards = []
    for name in ("a", "b"):
        status = deploy(api, namespace, name, vram="2GiB")
        assert status["phase"] == "DEPLOYED", status
        assert (status["node"], status["sharingClass"]) == (node, "whole_gpu")
        (card,) = status["gpuIndices"]
        cards.append(card)
        assert served_on(api, namespace, name) == node
        assert engine_requests(api, namespace, name) == host_and({f"cohabit.dev/gpu-{card}": "1"})
    assert sorted(cards) == [0, 1]
    message = refused(deploy(api, namespace, "c", vram="2GiB"), "insufficient_capacity",
                      permanent=False)  # fmt: skip
    # Each card is held whole (its full 15 GiB allocated), so neither has anything free.
    assert (
        message == f"0/1 nodes fit: 1 insufficient GPU memory (largest free 0 GiB on {node} gpu 0)"
    )
    assert no_engine_pod(api, namespace, "c")


def test_cpu_only_node_budgets_host_memory(
    api: client.ApiClient, namespace: str, nodes: Nodes, operators: Operators
) -> None:
    """A worker without GPUs: llama.cpp is placed on its memory pool (30.9 GiB less the 8
    GiB reserve), the pod's memory request and limit being the budget the scheduler checks."""
    node = nodes.recorded("labels_cpu.json", "cpu", labels=CPU_AGENT_LABELS)
    operators.start(values_for(namespace))
    status = deploy(api, namespace, "cpu-a", vram="20GiB")
    assert status["phase"] == "DEPLOYED", status
    assert (status["node"], status["hardwareClass"]) == (node, "cpu")
    assert served_on(api, namespace, "cpu-a") == node
    assert engine_requests(api, namespace, "cpu-a") == {"cpu": "1", "memory": "20Gi"}
    message = refused(deploy(api, namespace, "cpu-b", vram="20GiB"), "insufficient_system_memory",
                      permanent=False)  # fmt: skip
    assert message.startswith("0/1 nodes fit: 1 insufficient system memory (largest free 2.9")


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "node_state", "reason", "permanent", "sentence"),
    [
        pytest.param({"requiredVendor": "amd"}, "ready", "vendor_mismatch", True,
                     "0/1 nodes fit: 1 vendor mismatch", id="vendor-mismatch"),
        pytest.param({"minAccelVersion": "13.0"}, "ready", "accel_version_unmet", True,
                     "0/1 nodes fit: 1 accelerator version unmet", id="cuda-too-old"),
        pytest.param({"vram": "20GiB"}, "ready", "insufficient_capacity", True,
                     "0/1 nodes fit: 1 insufficient GPU memory"
                     " (largest free 15 GiB on {node} gpu 0)",
                     id="larger-than-the-card"),
        pytest.param({}, "cordoned", "insufficient_capacity", False,
                     "0/1 nodes fit: 1 not schedulable: cordoned", id="cordoned"),
        pytest.param({}, "kubelet-down", "insufficient_capacity", False,
                     "0/1 nodes fit: 1 not schedulable: not ready", id="not-ready"),
    ],
)  # fmt: skip
def test_refusals_name_their_reason_in_one_sentence(
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    spec: dict[str, str],
    node_state: str,
    reason: str,
    permanent: bool,
    sentence: str,
) -> None:
    """The 16 GB T4 (CUDA 12.2) as our agent publishes it: each refusal is cohabit's own,
    before any pod, with the reason id, the one-line sentence, the hint, and whether it is
    final (only what would not fit the empty cluster is)."""
    node = nodes.recorded("labels_t4_standalone.json", "t4", ready=node_state != "kubelet-down")
    if node_state == "cordoned":  # what `kubectl cordon` does
        client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": True}})
    operators.start(values_for(namespace))
    status = deploy(api, namespace, "m", **{"vram": "6GiB", **spec})
    assert refused(status, reason, permanent=permanent) == sentence.format(node=node)
    assert status["noFit"]["hint"]
    assert no_engine_pod(api, namespace, "m")


# --- how the ModelDeployment was written ---------------------------------------------------------


def test_kubectl_apply_is_placed_like_the_client(
    cluster: Cluster,
    api: client.ApiClient,
    namespace: str,
    nodes: Nodes,
    operators: Operators,
    tmp_path: Path,
) -> None:
    """The same spec written by `kubectl apply -f` (client-side apply: its
    last-applied-configuration annotation, its own field manager) and by the client the
    control plane uses lands the same way; an edited file applied again is re-placed."""
    node = nodes.recorded("labels_t4_standalone.json", "t4")
    operators.start(values_for(namespace))
    manifest = tmp_path / "by-kubectl.yaml"
    doc = model_deployment("by-kubectl", namespace, model=MODEL, vram="6GiB")
    manifest.write_text(yaml.safe_dump(doc))
    cluster.run("kubectl", "apply", "-f", str(manifest))
    KubernetesPort(api).create_model_deployment(
        model_deployment("by-client", namespace, model=MODEL, vram="6GiB")
    )
    placed = {name: phase(api, namespace, name, *SETTLED) for name in ("by-kubectl", "by-client")}
    fields = ("phase", "node", "gpuIndices", "sharingClass", "allocatedBytes", "notices")
    by_kubectl, by_client = ({k: s.get(k) for k in fields} for s in placed.values())
    assert by_kubectl == by_client
    assert (by_kubectl["phase"], by_kubectl["node"], by_kubectl["gpuIndices"]) == (
        "DEPLOYED",
        node,
        [0],
    )
    pods = [pod_json(api, namespace, f"{name}-engine") for name in placed]
    for part in ("affinity", "tolerations"):
        assert pods[0]["spec"][part] == pods[1]["spec"][part]
    assert [p["spec"]["containers"][0]["resources"] for p in pods] == 2 * [
        pods[1]["spec"]["containers"][0]["resources"]
    ]

    doc["spec"]["vram"] = "5GiB"
    manifest.write_text(yaml.safe_dump(doc))
    cluster.run("kubectl", "apply", "-f", str(manifest))
    status = wait_for(
        lambda: (
            (s := status_of(api, namespace, "by-kubectl")).get("observedGeneration") == 2
            and s.get("phase") == "DEPLOYED"
            and s
        ),
        what="the re-applied ModelDeployment to be placed again",
    )
    assert status["allocatedBytes"] == 5 * GIB
    assert engine_requests(api, namespace, "by-kubectl") == host_and(
        {"cohabit.dev/vram-gb-gpu-0": "5"}
    )
