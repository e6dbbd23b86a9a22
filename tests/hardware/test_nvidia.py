"""NVML adapter: recorded snapshots replayed through `FakeNvml`, a pynvml-shaped object passed
as the adapter's `nvml` seam (no monkeypatching, no GPU)."""

from __future__ import annotations

import pytest

from cohabit.hardware.errors import DiscoveryError
from cohabit.hardware.model import NoticeCode
from cohabit.hardware.nvidia import discover_nvidia, mig_profile_name
from cohabit.units import GIB, KIB, MIB
from tests.hardware import fakes
from tests.hardware.slotrows import slot_rows

T4 = 15360 * MIB
H100 = 81559 * MIB
GB10_HOST = 127600748 * KIB


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        pytest.param(
            "nvml_t4x4.json",
            [(f"n gpu {i}", "software_shared", "fractional", T4, T4) for i in range(4)],
            id="t4x4-discrete",
        ),
        pytest.param(
            "nvml_h100_mig_mixed.json",
            [
                (
                    "n gpu 0 mig 3g.40gb #0",
                    "hardware_isolated",
                    "mig_3g_40gb",
                    40192 * MIB,
                    40192 * MIB,
                ),
                (
                    "n gpu 0 mig 2g.20gb #1",
                    "hardware_isolated",
                    "mig_2g_20gb",
                    19968 * MIB,
                    19968 * MIB,
                ),
                (
                    "n gpu 0 mig 1g.10gb #2",
                    "hardware_isolated",
                    "mig_1g_10gb",
                    9856 * MIB,
                    9856 * MIB,
                ),
                (
                    "n gpu 0 mig 1g.10gb #3",
                    "hardware_isolated",
                    "mig_1g_10gb",
                    9856 * MIB,
                    9856 * MIB,
                ),
                ("n gpu 1", "software_shared", "fractional", H100, H100),
            ],
            id="h100-mig-on-and-off",
        ),
        pytest.param(
            "nvml_gb10.json",
            [
                (
                    "n unified pool",
                    "unified_memory",
                    "unified_memory",
                    GB10_HOST,
                    GB10_HOST - 8 * GIB,
                )
            ],
            id="gb10-unified-from-host-memory",
        ),
    ],
)
def test_snapshot_classifies(snapshot: str, expected: list[object]) -> None:
    """Each recorded machine, replayed through FakeNvml, gives these slots and classes."""
    recorded = fakes.load(snapshot)
    node = discover_nvidia(fakes.FakeNvml(recorded), name="n", host=fakes.host_of(recorded))
    assert node is not None
    assert slot_rows(node) == expected


def test_t4_details_are_read_in_the_libraries_units() -> None:
    """FakeNvml replays nvml_t4x4.json: bytes stay bytes, the CUDA integer becomes "12.2",
    compute capability, UUID, free memory and per-process usage are carried over."""
    node = discover_nvidia(fakes.nvml("nvml_t4x4.json"), name="n")
    assert node is not None
    gpu = node.gpus[0]
    assert (gpu.product, gpu.accel_version, gpu.driver_version) == (
        "Tesla T4",
        "12.2",
        "535.183.01",
    )
    assert (gpu.compute_capability, gpu.uuid) == ("7.5", "GPU-5f0c2b7e-9a1d-4c3e-8b6a-1d2e3f405a61")
    assert (gpu.memory_bytes, gpu.free_bytes) == (T4, T4 - 6711934976)
    assert gpu.mig_enabled is None  # T4 cannot do MIG: NVML says Not Supported
    assert [(p.pid, p.used_bytes) for p in gpu.processes] == [(41217, 6 * GIB)]
    assert node.notices == ()


def test_mig_instances_keep_their_uuids_and_the_off_card_stays_whole() -> None:
    """FakeNvml replays nvml_h100_mig_mixed.json: empty MIG slots (NOT_FOUND) are skipped."""
    node = discover_nvidia(fakes.nvml("nvml_h100_mig_mixed.json"), name="n")
    assert node is not None
    mig_gpu, whole_gpu = node.gpus
    assert mig_gpu.mig_enabled is True and whole_gpu.mig_enabled is False
    assert [p.uuid for p in mig_gpu.partitions][:1] == ["MIG-4a5b6c7d-8e9f-5a0b-9c1d-2e3f4a5b6c71"]
    assert whole_gpu.partitions == ()
    assert node.schedulable


def test_gb10_without_memory_info_is_a_unified_pool() -> None:
    """FakeNvml replays nvml_gb10.json (GetMemoryInfo → NVML_ERROR_NOT_SUPPORTED): the GPU has
    no memory of its own, the pool is MemTotal, live free is MemAvailable, and no notice —
    GB10 is a known unified-memory product."""
    recorded = fakes.load("nvml_gb10.json")
    node = discover_nvidia(fakes.FakeNvml(recorded), name="spark", host=fakes.host_of(recorded))
    assert node is not None
    assert node.gpus[0].memory_bytes is None
    assert node.unified_memory_bytes == GB10_HOST
    assert node.free_memory_bytes == 118566368 * KIB
    assert node.gpus[0].processes[0].used_bytes is None  # NVML could not say
    assert node.notices == ()


def test_pending_mig_change_makes_the_node_unschedulable() -> None:
    """FakeNvml replays nvml_a100_mig_pending.json: MigMode [current 0, pending 1]."""
    node = discover_nvidia(fakes.nvml("nvml_a100_mig_pending.json"), name="n")
    assert node is not None
    assert not node.schedulable
    assert node.unschedulable_reason == "MIG mode change pending on GPU 0 (GPU reset needed)"


@pytest.mark.parametrize("snapshot", ["nvml_library_not_found.json", "nvml_driver_not_loaded.json"])
def test_no_nvidia_stack_is_not_available_rather_than_a_fault(snapshot: str) -> None:
    """FakeNvml's nvmlInit raises LIBRARY_NOT_FOUND / DRIVER_NOT_LOADED: the answer is None."""
    assert discover_nvidia(fakes.nvml(snapshot), name="n") is None


def test_a_lost_gpu_is_a_fault_naming_the_call() -> None:
    """FakeNvml replays nvml_gpu_lost.json (GetMemoryInfo → GPU_IS_LOST); NVML is shut down."""
    fake = fakes.nvml("nvml_gpu_lost.json")
    with pytest.raises(
        DiscoveryError, match="nvml: nvmlDeviceGetMemoryInfo failed: NVML_ERROR_GPU_IS_LOST"
    ):
        discover_nvidia(fake, name="n")
    assert fake.calls[-1] == "nvmlShutdown"


def test_mig_enabled_without_instances_is_left_out_with_a_notice() -> None:
    """A snapshot edited from nvml_h100_mig_mixed.json: GPU 0 in MIG mode with every slot empty."""
    recorded = fakes.load("nvml_h100_mig_mixed.json")
    recorded["devices"][0]["mig_devices"] = [{"error": "NVML_ERROR_NOT_FOUND"}] * 7
    node = discover_nvidia(fakes.FakeNvml(recorded), name="n")
    assert node is not None
    assert [gpu.index for gpu in node.gpus] == [1]
    assert [n.code for n in node.notices] == [NoticeCode.PARTIAL_DISCOVERY]


@pytest.mark.parametrize(
    ("gpu_slices", "compute_slices", "memory_mib", "card_mib", "name"),
    [
        (1, 1, 4864, 40960, "1g.5gb"),  # A100 40GB
        (3, 3, 19968, 40960, "3g.20gb"),
        (7, 7, 40192, 40960, "7g.40gb"),
        (1, 1, 9856, 81559, "1g.10gb"),  # H100 80GB
        (1, 1, 19968, 81559, "1g.20gb"),
        (3, 3, 40192, 81559, "3g.40gb"),
        (7, 7, 80768, 81559, "7g.80gb"),
        (3, 1, 40192, 81559, "1c.3g.40gb"),  # a compute instance inside a 3-slice GPU instance
    ],
)
def test_mig_profile_names_match_the_gpu_operator(
    gpu_slices: int, compute_slices: int, memory_mib: int, card_mib: int, name: str
) -> None:
    """Profile names from NVML attributes (slices, memorySizeMB) and the card's total bytes."""
    assert (
        mig_profile_name(
            gpu_slices=gpu_slices,
            compute_slices=compute_slices,
            memory_mib=memory_mib,
            parent_total_bytes=card_mib * MIB,
        )
        == name
    )


def test_workstation_cards_carry_uuid_and_pci_address_in_bus_order() -> None:
    """FakeNvml replays nvml_workstation_3060ti_3090.json: each card keeps NVML's UUID and
    the busId of nvmlDeviceGetPciInfo; NVML's index is PCI bus order (8 GB card first)."""
    node = discover_nvidia(fakes.nvml("nvml_workstation_3060ti_3090.json"), name="ws")
    assert node is not None
    assert [(g.index, g.product, g.memory_bytes, g.uuid, g.pci_bus_id) for g in node.gpus] == [
        (0, "NVIDIA GeForce RTX 3060 Ti", 8 * GIB,
         "GPU-3c9a1f07-5b2e-8d44-0a6f-e1b27c9d4a30", "00000000:01:00.0"),
        (1, "NVIDIA GeForce RTX 3090", 24 * GIB,
         "GPU-8e41d2b6-07c3-f915-62ad-4b0e9f3c7d12", "00000000:02:00.0"),
    ]  # fmt: skip


def test_pci_address_is_optional() -> None:
    """A snapshot without nvmlDeviceGetPciInfo (the fake answers Not Supported) still reads."""
    node = discover_nvidia(fakes.nvml("nvml_t4x4.json"), name="n")
    assert node is not None
    assert [gpu.pci_bus_id for gpu in node.gpus] == [None] * 4
