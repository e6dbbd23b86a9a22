"""Fleet files: the issue's example reads into the right model and classes, round-trips
through `dump_fleet`, reads the same from JSON, and every mistake is one line naming the
file, the entry and the problem."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from cohabit.hardware.fleetfile import dump_fleet, fleet_to_dict, load_fleet
from cohabit.hardware.model import HardwareClass, Topology, Vendor
from cohabit.hardware.slots import slots_of
from cohabit.units import GIB, MIB, TIB
from cohabit.yamlfile import FileProblem
from tests.conftest import FIXTURES

EXAMPLE = FIXTURES / "fleets" / "issue_example.yaml"


def test_issue_example_reads_into_classes_and_capacities() -> None:
    fleet = load_fleet(EXAMPLE)
    assert fleet.topology is Topology.STANDALONE_CLUSTER and fleet.fractional
    table = [
        (s.location, s.hardware_class, s.sharing_class, s.capacity_bytes // GIB)
        for s in slots_of(fleet)
    ]
    assert table == [
        ("node-a gpu 0", HardwareClass.SOFTWARE_SHARED, "fractional", 16),
        ("node-a gpu 1 mig 3g.20gb #0", HardwareClass.HARDWARE_ISOLATED, "mig_3g_20gb", 20),
        ("node-a gpu 1 mig 1g.5gb #1", HardwareClass.HARDWARE_ISOLATED, "mig_1g_5gb", 5),
        ("workstation gpu 0", HardwareClass.SOFTWARE_SHARED, "fractional", 8),
        ("workstation gpu 1", HardwareClass.SOFTWARE_SHARED, "fractional", 24),
        ("spark unified pool", HardwareClass.UNIFIED_MEMORY, "unified_memory", 120),
        ("mac unified pool", HardwareClass.UNIFIED_MEMORY, "metal_spawner", 56),
        ("cpu-box cpu pool", HardwareClass.CPU, "cpu", 16),
    ]
    mac = fleet.nodes[3]
    assert mac.os == "macos" and mac.gpus[0].vendor is Vendor.APPLE


def test_dump_then_load_gives_the_same_fleet(tmp_path: Path) -> None:
    fleet = load_fleet(EXAMPLE)
    again = tmp_path / "again.yaml"
    again.write_text(dump_fleet(fleet))
    assert load_fleet(again) == fleet


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nodes: []", "'nodes' must list at least one node"),
        ("nodez: []", "unknown key 'nodez'"),
        ("nodes: [{name: a, memory: -4GiB}]", "nodes[0] (a): memory: size must not be negative"),
        ("nodes: [{name: a}]", "nodes[0] (a): a node without GPUs needs 'memory'"),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia}]}]",
            "nodes[0] (a).gpus[0]: missing 'memory'",
        ),
        (
            "nodes: [{name: a, memory: 8GiB}, {name: a, memory: 8GiB}]",
            "nodes[1] (a): duplicate node name 'a'",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 8GiB},"
            " {index: 0, vendor: nvidia, memory: 8GiB}]}]",
            "nodes[0] (a).gpus[1]: duplicate GPU index 0",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidea, memory: 8GiB}]}]",
            "'vendor' must be one of nvidia, amd, apple, intel, cpu, got 'nvidea'",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 8GiB, colour: red}]}]",
            "nodes[0] (a).gpus[0]: unknown key 'colour'",
        ),
        ("topology: cloud\nnodes: [{name: a, memory: 8GiB}]", "'topology' must be one of"),
        ("nodes: [{name: a, memory: 8GiB}", "not valid YAML (line"),
        ("- just a list", "expected a mapping at the top of the fleet file"),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 8GiB,"
            " partitions: [{profile: 7g.80gb, memory: 80GiB}]}]}]",
            "partitions add up to more memory than the GPU has",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 8GiB, uuid: GPU-1},"
            " {index: 1, vendor: nvidia, memory: 8GiB, uuid: GPU-1}]}]",
            "nodes[0] (a).gpus[1]: duplicate uuid 'GPU-1' on this node",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 8GiB,"
            " uuid: 5eff74a1-0000}]}]",
            "'uuid' of an nvidia GPU starts with 'GPU-'",
        ),
        (
            "nodes: [{name: a, gpus: [{index: 0, vendor: nvidia, memory: 80GiB,"
            " partitions: [{profile: 3g.40gb, memory: 40GiB, uuid: GPU-abc}]}]}]",
            "nodes[0] (a).gpus[0].partitions[0]: 'uuid' of a MIG slice starts with 'MIG-'",
        ),
        (
            f"nodes: [{{name: a, gpus: [{{index: 0, vendor: nvidia, memory: {10**30}}}]}}]",
            f"nodes[0] (a).gpus[0]: 'memory' must be at most 1 PiB, got {10**30}",
        ),
        (
            "nodes: [{name: a, memory: 1025TiB}]",
            "nodes[0] (a): 'memory' must be at most 1 PiB, got '1025TiB'",
        ),
        (
            "nodes:\n  - name: a\n    memory: 8GiB\n    memory: 800GiB\n",
            "not valid YAML (line 4): duplicate key 'memory' (first on line 3)",
        ),
        (
            "nodes: [{name: a, memory: 8GiB}]\nnodes: [{name: b, memory: 8GiB}]\n",
            "not valid YAML (line 2): duplicate key 'nodes' (first on line 1)",
        ),
    ],
)
def test_bad_fleet_files_say_what_and_where(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    assert_one_line_problem(path, problem)


def assert_one_line_problem(path: Path, problem: str) -> None:
    with pytest.raises(FileProblem) as raised:
        load_fleet(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    assert problem in message
    assert "\n" not in message


def test_missing_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(FileProblem, match="fleet file not found"):
        load_fleet(tmp_path / "nope.yaml")


def test_identities_round_trip(tmp_path: Path) -> None:
    """A GPU's uuid and pci_bus_id and a MIG slice's uuid survive load → dump → load."""
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "nodes:\n"
        "  - name: ws\n"
        "    gpus:\n"
        "      - {index: 0, vendor: nvidia, memory: 80GiB, uuid: GPU-aa,"
        " pci_bus_id: '00000000:01:00.0',\n"
        "         partitions: [{profile: 3g.40gb, memory: 40GiB, uuid: MIG-bb}]}\n"
    )
    fleet = load_fleet(path)
    gpu = fleet.nodes[0].gpus[0]
    assert (gpu.uuid, gpu.pci_bus_id, gpu.partitions[0].uuid) == (
        "GPU-aa",
        "00000000:01:00.0",
        "MIG-bb",
    )
    again = tmp_path / "again.yaml"
    again.write_text(dump_fleet(fleet))
    assert load_fleet(again) == fleet


def test_json_fleet_reads_as_the_yaml_one(tmp_path: Path) -> None:
    """The same document as JSON, named .json or only starting with `{`, gives the same Fleet."""
    fleet = load_fleet(EXAMPLE)
    document = json.dumps(fleet_to_dict(fleet))
    for name in ("fleet.json", "fleet.inventory"):
        path = tmp_path / name
        path.write_text(document)
        assert load_fleet(path) == fleet


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("f.json", '{"nodes": [{"name": "a", "memory": "8GiB"}', "not valid JSON (line 1)"),
        ("f.json", '{"nodes": [{"name": "a", "memory": NaN}]}', "NaN is not a JSON number"),
        ("f.json", '{"nodes": [{"name": "a", "memory": 1e999}]}', "number 1e999 is out of range"),
        ("f.json", '["nodes"]', "expected a mapping at the top of the fleet file"),
        ("f.json", '{"nodes": [{"name": "a", "memory": -1}]}', "nodes[0] (a): memory: size must"),
        ("f.txt", '{"nodes": [{"name": "a", "memory": "8GiB"}],}', "not valid JSON"),
        ("f.json", "[" * 100_000, "nested too deeply"),
        ("f.json", b"\xff\xfe{}", "fleet file is not UTF-8 text (byte 0)"),
        (
            "f.json",
            '{"nodes": [{"name": "a", "memory": "8GiB", "memory": "800GiB"}]}',
            "not valid JSON: duplicate key 'memory'",
        ),
    ],
)
def test_bad_json_fleet_files_say_what_and_where(
    tmp_path: Path, name: str, text: str | bytes, problem: str
) -> None:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert_one_line_problem(path, problem)


def test_what_is_not_a_regular_file_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """A FIFO with no writer would block `open()` for ever, `/dev/zero` never ends: both are
    refused from their status alone. The FIFO is loaded in a thread so that a loader which
    opens it fails this test (and is then released by a writer) instead of hanging it."""
    fifo = tmp_path / "fleet.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_fleet(fifo)
            outcome.append(None)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(timeout=60)
    if loader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # end the blocked open
        loader.join(timeout=60)
        pytest.fail("the loader opened the FIFO instead of refusing it")
    assert isinstance(outcome[0], FileProblem)
    assert str(outcome[0]) == f"{fifo}: fleet file is not a regular file"
    assert_one_line_problem(Path("/dev/zero"), "fleet file is not a regular file")
    assert_one_line_problem(tmp_path, "fleet file is not a regular file")


def test_a_sparse_tib_file_is_refused_unread(tmp_path: Path) -> None:
    """A sparse TiB file takes no disk here; read whole it would fill memory first."""
    sparse = tmp_path / "fleet.yaml"
    with sparse.open("wb") as file:
        file.truncate(TIB)
    assert_one_line_problem(sparse, "fleet file is larger than 16 MiB")


@pytest.mark.parametrize(("size_bytes", "refused"), [(16 * MIB, False), (16 * MIB + 1, True)])
def test_files_are_read_up_to_16_mib(tmp_path: Path, size_bytes: int, refused: bool) -> None:
    """A YAML comment padded to the size, then a fleet: only the cap decides."""
    fleet = b"\nnodes: [{name: a, memory: 8GiB}]\n"
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"#" * (size_bytes - len(fleet)) + fleet)
    if refused:
        assert_one_line_problem(path, "fleet file is larger than 16 MiB")
    else:
        assert load_fleet(path).nodes[0].memory_bytes == 8 * GIB
