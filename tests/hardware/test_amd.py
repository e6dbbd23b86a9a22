"""amdsmi adapter: recorded snapshots replayed through `FakeAmdSmi`, an amdsmi-shaped object
passed as the adapter's `amdsmi` seam (no monkeypatching, no GPU)."""

from __future__ import annotations

import pytest

from cohabit.hardware.amd import discover_amd
from cohabit.hardware.errors import DiscoveryError
from cohabit.units import GIB, KIB
from tests.hardware import fakes
from tests.hardware.slotrows import slot_rows

CPX = 24 * GIB
STRIX_HOST = 130392924 * KIB


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        pytest.param(
            "amdsmi_mi300x_cpx.json",
            [
                (
                    f"n gpu {i} partition cpx_nps4 #0",
                    "hardware_isolated",
                    "partition_cpx_nps4",
                    CPX,
                    CPX,
                )
                for i in range(8)
            ],
            id="mi300x-cpx-nps4",
        ),
        pytest.param(
            "amdsmi_strix_halo.json",
            [
                (
                    "n unified pool",
                    "unified_memory",
                    "unified_memory",
                    STRIX_HOST,
                    STRIX_HOST - 8 * GIB,
                )
            ],
            id="strix-halo-unified",
        ),
    ],
)
def test_snapshot_classifies(snapshot: str, expected: list[object]) -> None:
    """Each recorded machine, replayed through FakeAmdSmi, gives these slots and classes."""
    recorded = fakes.load(snapshot)
    node = discover_amd(fakes.FakeAmdSmi(recorded), name="n", host=fakes.host_of(recorded))
    assert node is not None
    assert slot_rows(node) == expected


def test_mi300x_partition_details() -> None:
    """FakeAmdSmi replays amdsmi_mi300x_cpx.json: MB becomes bytes, ROCm version and UUID kept,
    free memory is vram_total − vram_used."""
    node = discover_amd(fakes.amdsmi("amdsmi_mi300x_cpx.json"), name="n")
    assert node is not None
    gpu = node.gpus[3]
    assert (gpu.product, gpu.accel_version, gpu.compute_capability) == (
        "AMD Instinct MI300X",
        "6.4.1",
        "gfx942",
    )
    assert gpu.partitions[0].profile == "cpx_nps4"
    assert gpu.partitions[0].uuid == gpu.uuid == "GPU-5F3A9C21D84E0003"
    assert gpu.free_bytes == (24576 - 283) * 1024 * 1024
    assert gpu.driver_version == "6.10.5"


def test_strix_halo_gpu_has_no_memory_of_its_own() -> None:
    """FakeAmdSmi replays amdsmi_strix_halo.json: gfx1151 marks the APU; partition queries
    answer NOT_SUPPORTED and are simply absent; the 512 MB carve-out is not the pool."""
    recorded = fakes.load("amdsmi_strix_halo.json")
    node = discover_amd(fakes.FakeAmdSmi(recorded), name="n", host=fakes.host_of(recorded))
    assert node is not None
    assert node.gpus[0].memory_bytes is None
    assert node.gpus[0].partitions == ()
    assert node.unified_memory_bytes == STRIX_HOST


def test_init_error_is_not_available() -> None:
    """FakeAmdSmi's amdsmi_init raises (no amdgpu driver): the answer is None."""
    assert discover_amd(fakes.amdsmi("amdsmi_init_error.json"), name="n") is None


def test_required_call_failing_is_a_fault() -> None:
    """amdsmi_mi300x_cpx.json edited so that vram info fails: a DiscoveryError naming the call."""
    recorded = fakes.load("amdsmi_mi300x_cpx.json")
    recorded["processors"][0]["amdsmi_get_gpu_vram_info"] = {"error": "AMDSMI_STATUS_NOT_SUPPORTED"}
    fake = fakes.FakeAmdSmi(recorded)
    with pytest.raises(DiscoveryError, match="amdsmi: amdsmi_get_gpu_vram_info failed"):
        discover_amd(fake, name="n")
    assert fake.calls[-1] == "amdsmi_shut_down"


def test_uuids_are_rocr_form_and_indices_follow_kfd_order() -> None:
    """amdsmi_mi300x_cpx.json with its processors listed in reverse: indices still follow the
    KFD node ids (ROCr's enumeration), and each UUID is ROCr's ``GPU-<asic_serial hex>``."""
    recorded = fakes.load("amdsmi_mi300x_cpx.json")
    recorded["processors"] = list(reversed(recorded["processors"]))
    node = discover_amd(fakes.FakeAmdSmi(recorded), name="n")
    assert node is not None
    assert [(gpu.index, gpu.uuid) for gpu in node.gpus] == [
        (i, f"GPU-5F3A9C21D84E000{i}") for i in range(8)
    ]
    assert {gpu.pci_bus_id for gpu in node.gpus} == {None}  # bdf not recorded: unknown


def test_without_kfd_info_amdsmi_order_stands() -> None:
    recorded = fakes.load("amdsmi_mi300x_cpx.json")
    for processor in recorded["processors"]:
        del processor["amdsmi_get_gpu_kfd_info"]
    recorded["processors"] = list(reversed(recorded["processors"]))
    node = discover_amd(fakes.FakeAmdSmi(recorded), name="n")
    assert node is not None
    assert node.gpus[0].uuid == "GPU-5F3A9C21D84E0007"
