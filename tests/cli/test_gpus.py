"""`cohabit gpus`: run as a user runs it (a subprocess), on this machine and on fleet files;
`gpus_document` is also called directly with nodes discovered through the NVML fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cohabit.cli.gpus import gpus_document
from cohabit.hardware.fleetfile import dump_fleet, load_fleet
from cohabit.hardware.model import Fleet
from cohabit.hardware.nvidia import discover_nvidia
from cohabit.units import GIB, KIB, MIB
from tests.conftest import FIXTURES, run_cli
from tests.hardware import fakes

FLEET = FIXTURES / "hardware" / "fleet_gpus_cli.yaml"
SLOT_KEYS = {"hardware_class", "sharing_class", "total_bytes", "capacity_bytes"}


def test_this_machine_shows_its_slots_and_exits_0() -> None:
    """On a machine without a GPU (CI) this is the CPU pool; elsewhere, whatever is there."""
    table = run_cli("gpus")
    assert table.returncode == 0, table.stderr
    assert "hardware class" in table.stdout
    result = run_cli("gpus", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["source"] == "discovered"
    assert document["slots"]
    for slot in document["slots"]:
        assert set(slot) >= SLOT_KEYS
        assert 0 <= slot["capacity_bytes"] <= slot["total_bytes"]
        assert (slot["reserved_bytes"], slot["free_bytes"] <= slot["capacity_bytes"]) == (0, True)


def test_fleet_file_slots_carry_their_classes() -> None:
    """fleet_gpus_cli.yaml on a managed cluster: one row per device, partition or pool."""
    result = run_cli("gpus", "--json", "--fleet", str(FLEET))
    assert result.returncode == 0, result.stderr
    rows = [
        (
            s["location"],
            s["hardware_class"],
            s["sharing_class"],
            s["total_bytes"],
            s["capacity_bytes"],
            s["free_bytes"],
        )
        for s in json.loads(result.stdout)["slots"]
    ]
    spark = 127600748 * KIB
    assert rows == [
        ("t4 gpu 0", "software_shared", "fractional", 15360 * MIB, 15360 * MIB, 15360 * MIB),
        (
            "a100 gpu 0 mig 3g.20gb #0",
            "hardware_isolated",
            "mig_3g_20gb",
            19968 * MIB,
            19968 * MIB,
            19968 * MIB,
        ),
        (
            "a100 gpu 0 mig 1g.5gb #1",
            "hardware_isolated",
            "mig_1g_5gb",
            4864 * MIB,
            4864 * MIB,
            4864 * MIB,
        ),
        (
            "spark unified pool",
            "unified_memory",
            "unified_memory",
            spark,
            spark - 8 * GIB,
            spark - 8 * GIB,
        ),
        ("cpu-box cpu pool", "cpu", "cpu", 32 * GIB, 24 * GIB, 24 * GIB),
    ]


def test_table_names_the_classes() -> None:
    result = run_cli("gpus", "--fleet", str(FLEET))
    assert result.returncode == 0, result.stderr
    for text in ("mig_1g_5gb", "fractional", "unified_memory", "cpu pool"):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "fleet file not found"),
        ("nodes: [\n", "not valid YAML"),
        ("nodes:\n  - {name: x, gpus: [{index: 0, vendor: nvidia}]}\n", "missing 'memory'"),
    ],
)
def test_bad_fleet_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "fleet.yaml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    result = run_cli("gpus", "--fleet", str(path))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_export_writes_a_fleet_file_that_loads(tmp_path: Path) -> None:
    """`--export` on this machine: the file is what `cohabit plan` reads."""
    path = tmp_path / "here.yaml"
    result = run_cli("gpus", "--json", "--export", str(path))
    assert result.returncode == 0, result.stderr
    fleet = load_fleet(path)
    assert len(fleet.nodes) == 1
    assert json.loads(result.stdout)["nodes"][0]["name"] == fleet.nodes[0].name


def test_export_to_an_unwritable_place_is_exit_2(tmp_path: Path) -> None:
    result = run_cli("gpus", "--export", str(tmp_path / "no" / "such" / "dir.yaml"))
    assert result.returncode == 2
    assert "cannot write fleet file" in result.stderr


def test_live_free_is_nvml_free_and_reservations_come_off() -> None:
    """A T4 host discovered through FakeNvml (nvml_t4x4.json): free is NVML's free memory;
    the `reserved` seam (bytes per slot key, from the future store) lowers it further."""
    node = discover_nvidia(fakes.nvml("nvml_t4x4.json"), name="t4")
    assert node is not None
    fleet = Fleet(nodes=(node,))
    nvml_free = 15360 * MIB - 6711934976
    live = gpus_document(fleet, live=True)
    assert [s["free_bytes"] for s in live["slots"]][:2] == [nvml_free, 15360 * MIB - 269484032]
    reserved = gpus_document(fleet, live=True, reserved={("t4", 1, None): 10 * GIB})
    assert reserved["slots"][1]["reserved_bytes"] == 10 * GIB
    assert reserved["slots"][1]["free_bytes"] == 15360 * MIB - 10 * GIB
    assert live["nodes"][0]["gpus"][0]["processes"] == [{"pid": 41217, "used_bytes": 6 * GIB}]


def test_identities_are_shown_and_exported(tmp_path: Path) -> None:
    """The mixed workstation (nvml_workstation_3060ti_3090.json): `--json` shows each card's
    UUID and PCI address, on the GPU and on its slot, and what `--export` writes (dump_fleet)
    loads back with them."""
    node = discover_nvidia(fakes.nvml("nvml_workstation_3060ti_3090.json"), name="ws")
    assert node is not None
    fleet = Fleet(nodes=(node,))
    document = gpus_document(fleet, live=True)
    gpus = [(g["uuid"], g["pci_bus_id"]) for g in document["nodes"][0]["gpus"]]
    slots = [(s["device_uuid"], s["pci_bus_id"]) for s in document["slots"]]
    assert (
        gpus
        == slots
        == [
            ("GPU-3c9a1f07-5b2e-8d44-0a6f-e1b27c9d4a30", "00000000:01:00.0"),
            ("GPU-8e41d2b6-07c3-f915-62ad-4b0e9f3c7d12", "00000000:02:00.0"),
        ]
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(dump_fleet(fleet))
    exported = load_fleet(path).nodes[0].gpus
    assert [(g.uuid, g.pci_bus_id) for g in exported] == gpus
