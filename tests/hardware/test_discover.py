"""Local discovery order (NVIDIA, AMD, Apple, CPU host) and the CPU pool, with every library
replaced through `discover_local_node`'s seams by the fakes in `fakes.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohabit.hardware.discover import discover_local_fleet, discover_local_node
from cohabit.hardware.fleetfile import dump_fleet, load_fleet
from cohabit.hardware.host import HostMemory, discover_host, parse_meminfo
from cohabit.hardware.model import Fleet, Vendor
from cohabit.hardware.slots import slots_of
from cohabit.units import GIB, KIB
from tests.hardware import fakes

NO_NVML = "nvml_library_not_found.json"
NO_AMD = "amdsmi_init_error.json"
HOST = HostMemory(total_bytes=64 * GIB, available_bytes=60 * GIB)


@pytest.mark.parametrize(
    ("nvml", "amdsmi", "sysctl", "vendor"),
    [
        pytest.param(
            "nvml_t4x4.json", "amdsmi_mi300x_cpx.json", None, Vendor.NVIDIA, id="nvidia-first"
        ),
        pytest.param(NO_NVML, "amdsmi_mi300x_cpx.json", None, Vendor.AMD, id="then-amd"),
        pytest.param(NO_NVML, NO_AMD, "sysctl_m2max.json", Vendor.APPLE, id="then-apple"),
        pytest.param(NO_NVML, NO_AMD, "sysctl_intel_mac.json", Vendor.CPU, id="else-cpu-pool"),
    ],
)
def test_first_adapter_that_finds_accelerators_wins(
    nvml: str, amdsmi: str, sysctl: str | None, vendor: Vendor
) -> None:
    """Fakes replay the named snapshots; the CPU host is a fixed 64 GiB HostMemory."""
    node = discover_local_node(
        name="box",
        nvml=fakes.nvml(nvml),
        amdsmi=fakes.amdsmi(amdsmi),
        sysctl=fakes.sysctl(sysctl) if sysctl else (lambda key: None),
        host=HOST,
    )
    slots = slots_of(Fleet(nodes=(node,)))
    assert slots[0].vendor is vendor


def test_cpu_host_is_a_pool_with_the_reserve() -> None:
    """A host with no accelerator: system memory minus 8 GiB, live free is MemAvailable."""
    memory = parse_meminfo("MemTotal:       32386412 kB\nMemAvailable:   30000000 kB\n")
    assert memory is not None
    node = discover_host(memory=memory, name="cpu")
    (slot,) = slots_of(Fleet(nodes=(node,)))
    assert (slot.hardware_class.value, slot.sharing_class) == ("cpu", "cpu")
    assert slot.capacity_bytes == 32386412 * KIB - 8 * GIB
    assert node.free_memory_bytes == 30000000 * KIB


def test_this_machine_discovers_without_crashing() -> None:
    """The real libraries of this machine (here: no GPU) — a node always comes back."""
    fleet = discover_local_fleet()
    assert len(fleet.nodes) == 1
    assert slots_of(fleet)


@pytest.mark.parametrize(
    ("nvml", "amdsmi", "sysctl"),
    [
        ("nvml_t4x4.json", NO_AMD, None),
        ("nvml_h100_mig_mixed.json", NO_AMD, None),
        ("nvml_gb10.json", NO_AMD, None),
        (NO_NVML, "amdsmi_mi300x_cpx.json", None),
        (NO_NVML, "amdsmi_strix_halo.json", None),
        (NO_NVML, NO_AMD, "sysctl_m2max.json"),
        (NO_NVML, NO_AMD, "sysctl_intel_mac.json"),
    ],
)
def test_export_reads_back_to_the_same_slots(
    tmp_path: Path, nvml: str, amdsmi: str, sysctl: str | None
) -> None:
    """Every faked machine written as a fleet file (what `--export` does) and read back by
    `load_fleet` gives the same slots; the live view (free, processes) is not exported."""
    recorded = fakes.load(nvml if nvml != NO_NVML else amdsmi)
    sysctl_fake = fakes.sysctl(sysctl) if sysctl else None
    fleet = discover_local_fleet(
        name="box",
        nvml=fakes.nvml(nvml),
        amdsmi=fakes.amdsmi(amdsmi),
        sysctl=sysctl_fake or (lambda key: None),
        host=fakes.host_of(recorded) or HOST,
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(dump_fleet(fleet), encoding="utf-8")
    assert slots_of(load_fleet(path)) == slots_of(fleet)
