"""Kubernetes node labels ⇄ Node: recorded label sets (GPU Operator / GFD, AMD labeller, ours)
read by `node_from_labels`, and what our agent publishes, read back. Pure functions: each
fixture's labels, allocatable and capacity are passed in as plain mappings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cohabit.hardware.labels import (
    allocatable_for_node,
    annotations_for_node,
    label_value,
    labels_for_node,
    node_from_labels,
)
from cohabit.hardware.model import Fleet, Gpu, Node, NoticeCode, Topology, Vendor
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.hardware.slots import slots_of
from cohabit.units import GIB, KIB, MIB
from tests.hardware import fakes
from tests.hardware.slotrows import slot_rows

MANAGED = Topology.MANAGED_CLUSTER


def read(name: str) -> Node:
    recorded: dict[str, Any] = fakes.load(name)
    return node_from_labels(
        recorded["name"],
        recorded["labels"],
        allocatable=recorded.get("allocatable"),
        memory_capacity=recorded.get("capacity", {}).get("memory"),
    )


def rows(name: str) -> list[tuple[str, str, str, int, int]]:
    """Slot rows on a managed cluster, locations without the node name."""
    node = read(name)
    return [
        (location.removeprefix(f"{node.name} "), hw_class, sharing, total, capacity)
        for location, hw_class, sharing, total, capacity in slot_rows(node, topology=MANAGED)
    ]


T4, L4, A100_1G, H100 = 15360 * MIB, 23034 * MIB, 4864 * MIB, 81559 * MIB


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        pytest.param(
            "labels_gpu_operator_timeslicing.json",
            [("gpu 0", "software_shared", "time_slicing_4replicas", T4, T4)],
            id="time-slicing-4",
        ),
        pytest.param(
            "labels_gpu_operator_mps.json",
            [(f"gpu {i}", "software_shared", "mps", L4, L4) for i in range(2)],
            id="mps",
        ),
        pytest.param(
            "labels_gpu_operator_no_sharing.json",
            [(f"gpu {i}", "software_shared", "whole_gpu", L4, L4) for i in range(2)],
            id="operator-without-sharing-is-whole-gpu",
        ),
        pytest.param(
            "labels_mig_single.json",
            [
                (f"gpu {i} mig 1g.5gb #0", "hardware_isolated", "mig_1g_5gb", A100_1G, A100_1G)
                for i in range(7)
            ],
            id="mig-single",
        ),
        pytest.param(
            "labels_mig_mixed.json",
            [
                ("gpu 0", "software_shared", "whole_gpu", H100, H100),
                (
                    "gpu 1 mig 1g.10gb #0",
                    "hardware_isolated",
                    "mig_1g_10gb",
                    9856 * MIB,
                    9856 * MIB,
                ),
                (
                    "gpu 2 mig 1g.10gb #0",
                    "hardware_isolated",
                    "mig_1g_10gb",
                    9856 * MIB,
                    9856 * MIB,
                ),
                (
                    "gpu 3 mig 2g.20gb #0",
                    "hardware_isolated",
                    "mig_2g_20gb",
                    19968 * MIB,
                    19968 * MIB,
                ),
                (
                    "gpu 4 mig 3g.40gb #0",
                    "hardware_isolated",
                    "mig_3g_40gb",
                    40192 * MIB,
                    40192 * MIB,
                ),
            ],
            id="mig-mixed-plus-a-whole-card",
        ),
        pytest.param(
            "labels_gb10.json",
            [
                (
                    "unified pool",
                    "unified_memory",
                    "unified_memory",
                    127600748 * KIB,
                    127600748 * KIB - 8 * GIB,
                )
            ],
            id="gb10-unified-from-node-capacity",
        ),
        pytest.param(
            "labels_cohabit_standalone.json",
            [(f"gpu {i}", "software_shared", "fractional", T4, T4) for i in range(2)],
            id="our-own-labels",
        ),
        pytest.param(
            "labels_cpu.json",
            [("cpu pool", "cpu", "cpu", 32386412 * KIB, 32386412 * KIB - 8 * GIB)],
            id="no-gpu-labels",
        ),
    ],
)
def test_labels_classify(fixture: str, expected: list[object]) -> None:
    """The recorded label set, on a managed cluster, gives these slots and classes."""
    assert rows(fixture) == expected


@pytest.mark.parametrize(
    ("fixture", "schedulable", "notices"),
    [
        ("labels_gpu_operator_timeslicing.json", True, []),
        ("labels_gpu_operator_no_sharing.json", True, [NoticeCode.SHARING_NOT_CONFIGURED]),
        ("labels_mig_single.json", True, []),
        ("labels_mig_pending.json", False, [NoticeCode.SHARING_NOT_CONFIGURED]),
        ("labels_gb10.json", True, []),
        (
            "labels_partial.json",
            True,
            [NoticeCode.PARTIAL_DISCOVERY, NoticeCode.SHARING_NOT_CONFIGURED],
        ),
    ],
)
def test_schedulable_and_notices(
    fixture: str, schedulable: bool, notices: list[NoticeCode]
) -> None:
    """What each slot carries: mid-MIG-reconfiguration gets no placements; a managed node with
    the operator and no sharing strategy is not configured for sharing."""
    node = read(fixture)
    slots = slots_of(Fleet(topology=MANAGED, nodes=(node,)))
    assert {slot.schedulable for slot in slots} == {schedulable}
    assert sorted(set(code for slot in slots for code in slot.notices)) == sorted(notices)


def test_mig_pending_says_why() -> None:
    node = read("labels_mig_pending.json")
    assert node.unschedulable_reason == (
        "MIG reconfiguration pending (nvidia.com/mig.config.state=pending)"
    )


def test_partial_labels_name_what_is_missing() -> None:
    """labels_partial.json has a product only: memory and CUDA version are named; the GPU
    (counted from allocatable) offers nothing until its memory is known."""
    node = read("labels_partial.json")
    (notice,) = node.notices
    assert notice.message == (
        "missing: nvidia.com/cuda.runtime-version.full, nvidia.com/gpu.memory"
    )
    assert [gpu.memory_bytes for gpu in node.gpus] == [None]


def test_time_slicing_strips_shared_suffix_and_keeps_versions() -> None:
    node = read("labels_gpu_operator_timeslicing.json")
    gpu = node.gpus[0]
    assert (gpu.product, gpu.accel_version, gpu.compute_capability) == ("Tesla-T4", "12.2", "7.5")
    assert gpu.driver_version == "535.183.01"
    assert (node.sharing_replicas, node.sharing_configured) == (4, True)


def test_amd_cpx_partitions_from_allocatable() -> None:
    """labels_amd_mi300x_cpx.json: 64 partitions of 24 GiB (`amd.com/gpu.vram=24G`)."""
    node = read("labels_amd_mi300x_cpx.json")
    slots = slots_of(Fleet(topology=MANAGED, nodes=(node,)))
    assert len(slots) == 64
    assert {(s.hardware_class.value, s.sharing_class, s.capacity_bytes) for s in slots} == {
        ("hardware_isolated", "partition_cpx_nps4", 24 * GIB)
    }
    assert node.gpus[0].vendor is Vendor.AMD


def test_mig_mixed_without_allocatable_cannot_tell_whole_cards() -> None:
    """labels_mig_mixed.json without its allocatable: the MIG slices are read from labels,
    and the notice says allocatable nvidia.com/gpu is needed to find the whole cards."""
    recorded = fakes.load("labels_mig_mixed.json")
    node = node_from_labels(recorded["name"], recorded["labels"])
    assert len(node.gpus) == 4
    assert "allocatable nvidia.com/gpu" in node.notices[0].message


@pytest.mark.parametrize(
    ("snapshot", "labels", "allocatable"),
    [
        pytest.param(
            "nvml_t4x4.json",
            {
                "cohabit.dev/gpu-vendor": "nvidia",
                "cohabit.dev/gpu-count": "4",
                "cohabit.dev/gpu-product": "Tesla-T4",
                "cohabit.dev/gpu-accel-version": "12.2",
                "cohabit.dev/gpu-memory-class": "discrete",
                "cohabit.dev/gpu-memory-mib": "15360",
            },
            {f"cohabit.dev/vram-gb-gpu-{i}": "15" for i in range(4)},
            id="t4x4",
        ),
        pytest.param(
            "nvml_gb10.json",
            {
                "cohabit.dev/gpu-vendor": "nvidia",
                "cohabit.dev/gpu-count": "1",
                "cohabit.dev/gpu-product": "NVIDIA-GB10",
                "cohabit.dev/gpu-accel-version": "13.0",
                "cohabit.dev/gpu-memory-class": "unified",
                "cohabit.dev/gpu-memory-mib": "124610",
            },
            # 127600748 KiB − 8 GiB = 113.7 GiB: capacity rounds down.
            {"cohabit.dev/vram-gb-gpu-0": "113"},
            id="gb10",
        ),
        pytest.param(
            "nvml_h100_mig_mixed.json",
            {
                "cohabit.dev/gpu-vendor": "nvidia",
                "cohabit.dev/gpu-count": "2",
                "cohabit.dev/gpu-product": "NVIDIA-H100-80GB-HBM3",
                "cohabit.dev/gpu-accel-version": "12.4",
                "cohabit.dev/gpu-memory-class": "discrete",
                "cohabit.dev/gpu-memory-mib": "81559",
            },
            # MIG slices are the NVIDIA device plugin's to advertise; only the whole card is ours.
            {"cohabit.dev/vram-gb-gpu-1": "79"},
            id="h100-mig",
        ),
    ],
)
def test_what_the_agent_publishes(
    snapshot: str, labels: dict[str, str], allocatable: dict[str, str]
) -> None:
    """A node discovered from a FakeNvml snapshot, turned into our labels and budgets."""
    recorded = fakes.load(snapshot)
    node = discover_nvidia(fakes.FakeNvml(recorded), name="n", host=fakes.host_of(recorded))
    assert node is not None
    assert labels_for_node(node) == labels
    assert allocatable_for_node(node) == allocatable


def test_cpu_node_publishes_vendor_only() -> None:
    node = Node(name="c", memory_bytes=32 * GIB)
    assert labels_for_node(node) == {"cohabit.dev/gpu-vendor": "cpu"}
    assert allocatable_for_node(node) == {}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("AMD Radeon(TM) 8060S", "AMD-Radeon-TM-8060S"),
        ("x" * 70, "x" * 63),
        (" Apple M2 Max ", "Apple-M2-Max"),
    ],
)
def test_label_values_are_valid(text: str, value: str) -> None:
    assert label_value(text) == value


_sizes_mib = st.integers(min_value=1024, max_value=200_000)


@st.composite
def _nodes(draw: st.DrawFn) -> Node:
    vendor = draw(st.sampled_from([Vendor.NVIDIA, Vendor.AMD]))
    if draw(st.booleans()):
        return Node(
            name="n",
            gpus=(Gpu(index=0, vendor=vendor, product="Some GPU", accel_version="12.4"),),
            unified_memory_bytes=draw(st.integers(min_value=16 * 1024, max_value=512 * 1024)) * MIB,
        )
    sizes = draw(st.lists(_sizes_mib, min_size=1, max_size=8))
    return Node(
        name="n",
        gpus=tuple(
            Gpu(index=i, vendor=vendor, product="Some GPU", memory_bytes=size * MIB)
            for i, size in enumerate(sizes)
        ),
    )


@given(_nodes())
def test_our_labels_read_back_to_the_same_budgets(node: Node) -> None:
    """Property: what the agent publishes for a node (labels + allocatable), read back by
    `node_from_labels`, gives the same slots, classes and capacities, on any topology."""
    back = node_from_labels(
        node.name, labels_for_node(node), allocatable=allocatable_for_node(node)
    )
    for topology in Topology:
        before = slots_of(Fleet(topology=topology, nodes=(node,)))
        after = slots_of(Fleet(topology=topology, nodes=(back,)))
        assert [
            (s.hardware_class, s.sharing_class, s.capacity_bytes, s.gpu_index) for s in after
        ] == [(s.hardware_class, s.sharing_class, s.capacity_bytes, s.gpu_index) for s in before]
    assert back.notices == ()


def test_agent_annotations_give_gpus_their_identity_back() -> None:
    """The workstation discovered from nvml_workstation_3060ti_3090.json, published as our
    labels, budgets and annotations, reads back with each card's UUID and PCI address."""
    node = discover_nvidia(fakes.nvml("nvml_workstation_3060ti_3090.json"), name="ws")
    assert node is not None
    annotations = annotations_for_node(node)
    assert annotations["cohabit.dev/gpu-1-uuid"] == "GPU-8e41d2b6-07c3-f915-62ad-4b0e9f3c7d12"
    assert annotations["cohabit.dev/gpu-1-pci-bus-id"] == "00000000:02:00.0"
    back = node_from_labels(
        "ws",
        labels_for_node(node),
        allocatable=allocatable_for_node(node),
        annotations=annotations,
    )
    assert [(g.index, g.uuid, g.pci_bus_id) for g in back.gpus] == [
        (g.index, g.uuid, g.pci_bus_id) for g in node.gpus
    ]
    without = node_from_labels("ws", labels_for_node(node), allocatable=allocatable_for_node(node))
    assert {g.uuid for g in without.gpus} == {None}


def test_mig_slice_uuids_are_annotated() -> None:
    node = discover_nvidia(fakes.nvml("nvml_h100_mig_mixed.json"), name="n")
    assert node is not None
    annotations = annotations_for_node(node)
    assert annotations["cohabit.dev/gpu-0-partition-0-uuid"] == (
        "MIG-4a5b6c7d-8e9f-5a0b-9c1d-2e3f4a5b6c71"
    )
