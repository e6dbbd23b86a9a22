"""Which of a node's GPUs something else offers too (`dra.offered_elsewhere`), from the
ResourceSlices on the node and its allocatable, as the API server returns them. Pure: the
other drivers' slices are shaped after their sources, cited where they are built; the
real API server validates the same shapes in tests/cluster/test_dra.py."""

from __future__ import annotations

from typing import Any

from cohabit.hardware.model import Gpu, Node, Partition, Vendor
from cohabit.kube import dra
from cohabit.units import GIB

CARD = "GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61"
MIG = "MIG-4a5b6c7d-8e9f-5a0b-9c1d-2e3f4a5b6c71"
NODE = Node(
    name="n",
    gpus=(
        Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB,
            uuid=CARD, pci_bus_id="00000000:3B:00.0"),
        Gpu(index=1, vendor=Vendor.NVIDIA, product="H100", memory_bytes=80 * GIB,
            uuid="GPU-2d0f1a3b-4c5e-6f7a-9b0c-1d2e3f4a5b62",
            partitions=(Partition(profile="1g.10gb", memory_bytes=10 * GIB, uuid=MIG),)),
    ),
)  # fmt: skip


def other(driver: str, **attributes: str) -> dict[str, Any]:
    device = {"name": "d", "attributes": {k: {"string": v} for k, v in attributes.items()}}
    return {"metadata": {"name": f"n-{driver}"}, "spec": {"driver": driver, "devices": [device]}}


def test_a_card_named_by_uuid_or_pci_address_or_a_partition_is_offered_elsewhere() -> None:
    # NVIDIA's driver: `uuid` of a card; a MIG device's own `uuid` and its `parentUUID`
    # (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin deviceinfo.go, mig.go).
    assert dra.offered_elsewhere(NODE, [other("gpu.nvidia.com", uuid=CARD)], {}) == {
        0: "DRA driver gpu.nvidia.com"
    }
    assert dra.offered_elsewhere(NODE, [other("gpu.nvidia.com", uuid=MIG)], {}) == {
        1: "DRA driver gpu.nvidia.com"
    }
    # The standard attribute, in the short domain form and lower case.
    standard = other("x.example.com", **{dra.ATTRIBUTE_PCI_BUS_ID: "0000:3b:00.0"})
    assert dra.offered_elsewhere(NODE, [standard], {}) == {0: "DRA driver x.example.com"}


def test_our_own_slices_zero_resources_and_other_vendors_do_not_count() -> None:
    ours = other(dra.DRIVER, uuid=CARD)
    allocatable = {"nvidia.com/gpu": "0", "amd.com/gpu": "2", "cpu": "8"}
    assert dra.offered_elsewhere(NODE, [ours], allocatable) == {}


def test_a_vendor_device_plugin_offers_every_card_of_its_vendor() -> None:
    """HAMi's device plugin advertises `nvidia.com/gpu` and `nvidia.com/gpumem`; the first
    name in order is the one reported. A DRA driver naming a card is reported first."""
    allocatable = {"nvidia.com/gpumem": "16384", "nvidia.com/gpu": "10"}
    found = dra.offered_elsewhere(NODE, [other("gpu.nvidia.com", uuid=CARD)], allocatable)
    assert found == {0: "DRA driver gpu.nvidia.com", 1: "device plugin nvidia.com/gpu"}


def test_withdrawn_cards_and_their_partitions_are_not_published() -> None:
    (devices,) = (s for s in dra.node_slices(NODE, withdrawn={1}) if "devices" in s["spec"])
    assert [d["name"] for d in devices["spec"]["devices"]] == ["gpu-0"]
    assert len(dra.node_slices(NODE, withdrawn={1})) == 1  # no counter set for gpu 1
    (devices,) = dra.node_slices(NODE, withdrawn={0, 1})
    assert devices["spec"]["devices"] == []
