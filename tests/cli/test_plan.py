"""`cohabit plan`, run as a user runs it (a subprocess): the JSON document, the table, and
one clear line with exit code 2 for bad files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cohabit.cli.plan import write_plan_json
from cohabit.units import GIB
from tests.conftest import FIXTURES, run_cli

FLEET = FIXTURES / "fleets" / "issue_example.yaml"
EXAMPLE_REQUESTS = str(Path(__file__).parents[2] / "examples" / "requests.yaml")
T4_FLEET = """
nodes:
  - name: node-a
    gpus: [{index: 0, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: "12.4"}]
"""
T4_REQUESTS = """
requests:
  - {name: a, vram: 6GiB}
  - {name: b, vram: 6GiB}
  - {name: c, vram: 6GiB}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def plan_t4_example(tmp_path: Path) -> dict[str, Any]:
    """`cohabit plan --json` on the seed T4 example (YAML files): the parsed document."""
    result = run_cli(
        "plan",
        str(write(tmp_path, "f.yaml", T4_FLEET)),
        str(write(tmp_path, "r.yaml", T4_REQUESTS)),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_json_document_for_the_seed_t4_example(tmp_path: Path) -> None:
    document = plan_t4_example(tmp_path)
    a, b, c = document["placements"]
    assert a == {
        "name": "a",
        "placed": True,
        "node": "node-a",
        "gpu_indices": [0],
        "partition": None,
        "hardware_class": "software_shared",
        "sharing_class": "fractional",
        "allocated_bytes": 6 * GIB,
        "allocated_capacity_gb": 6,
        "notices": [],
    }
    assert b["node"] == "node-a" and b["gpu_indices"] == [0]
    assert c["placed"] is False and c["reason"] == "insufficient_capacity"
    assert c["message"].startswith("0/1 nodes fit: 1 insufficient GPU memory (largest free 4 GiB")
    assert c["details"]["requested_bytes"] == 6 * GIB
    assert c["details"]["largest_free_bytes"] == 4 * GIB
    assert c["details"]["largest_free_location"] == "node-a gpu 0"
    assert document["summary"] == {"placed": 2, "failed": 1}


def test_batch_flag_places_more(tmp_path: Path) -> None:
    requests = write(
        tmp_path,
        "r.yaml",
        "requests: [{name: a, vram: 10GiB}, {name: b, vram: 6GiB},"
        " {name: c, vram: 6GiB}, {name: d, vram: 4GiB}]",
    )
    fleet = write(tmp_path, "f.yaml", T4_FLEET)
    online = json.loads(run_cli("plan", str(fleet), str(requests), "--json").stdout)
    batch = json.loads(run_cli("plan", str(fleet), str(requests), "--batch", "--json").stdout)
    assert online["summary"] == {"placed": 2, "failed": 2}
    assert batch["summary"] == {"placed": 3, "failed": 1}


def test_priorities_unload_earlier_idle_ones_for_a_request_that_does_not_fit(
    tmp_path: Path,
) -> None:
    """On one 16 GiB card: `c` (priority 5) unloads `a` (priority 0), not `b` (priority 9);
    `d` (priority 0) does not fit and says why preemption could not help; `e`, of the same
    priority as the scale-to-zero `c`, unloads it."""
    requests = write(
        tmp_path,
        "r.yaml",
        "requests: [{name: a, vram: 8GiB}, {name: b, vram: 8GiB, priority: 9},"
        " {name: c, vram: 6GiB, priority: 5, min_copies: 0}, {name: d, vram: 12GiB},"
        " {name: e, vram: 8GiB, priority: 5}]",
    )
    fleet = write(tmp_path, "f.yaml", T4_FLEET)
    result = run_cli("plan", str(fleet), str(requests), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    a, b, c, d, e = document["placements"]
    assert a["unloaded_by"] == "c" and "unloaded_by" not in b
    assert c["placed"] and c["unloaded_by"] == "e"
    assert not d["placed"]
    assert d["message"].endswith(
        "preemption cannot help: no idle copy it may unload (priority below 0, or 0 with "
        "min_copies 0) holds budget where it could go; 2 of higher priority"
    )
    assert e["placed"] and e["gpu_indices"] == [0]
    assert document["summary"] == {"placed": 4, "failed": 1, "unloaded": 2}
    table = run_cli("plan", str(fleet), str(requests))
    assert "node-a gpu 0, then unloaded for c" in table.stdout
    assert "4 placed, 1 did not fit, 2 unloaded for others" in table.stdout


def test_batch_takes_no_priorities(tmp_path: Path) -> None:
    requests = write(tmp_path, "r.yaml", "requests: [{name: a, vram: 8GiB, priority: 1}]")
    result = run_cli("plan", str(write(tmp_path, "f.yaml", T4_FLEET)), str(requests), "--batch")
    assert result.returncode == 2
    assert "--batch chooses what to place by itself" in result.stderr
    assert "Traceback" not in result.stderr


def test_table_shows_placements_bars_and_reasons() -> None:
    result = run_cli("plan", str(FLEET), EXAMPLE_REQUESTS)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "node-a gpu 1 mig 1g.5gb #1" in out
    assert "metal_spawner" in out and "█" in out
    assert "rocm-only: 0/5 nodes fit: 5 vendor mismatch" in out
    assert "7 placed, 2 did not fit" in out


def test_pools_have_no_gpu_indices_and_mig_names_its_profile() -> None:
    document = json.loads(run_cli("plan", str(FLEET), EXAMPLE_REQUESTS, "--json").stdout)
    by_name = {p["name"]: p for p in document["placements"]}
    assert by_name["gpt-oss-120b"]["gpu_indices"] == []
    assert by_name["gpt-oss-120b"]["hardware_class"] == "unified_memory"
    assert by_name["phi-4-mini-mig"]["partition"] == "1g.5gb"
    assert by_name["llama-3.1-70b-tp2"]["reason"] == "insufficient_gpu_count"


@pytest.mark.parametrize(
    ("requests_text", "problem"),
    [
        ("requests: [{name: a}]", "requests[0] (a): missing 'vram'"),
        ("requests: [{name: a, vram: -6GiB}]", "requests[0] (a): vram: size must not be negative"),
        ("requests: [{name: a, vram: 0}]", "requests[0] (a): 'vram' must be greater than zero"),
        (
            "requests: [{name: a, vram: 6GiB}, {name: a, vram: 6GiB}]",
            "requests[1] (a): duplicate request name 'a'",
        ),
        (
            "requests: [{name: a, vram: 6GiB, tensor_parallel: 0}]",
            "requests[0] (a): 'tensor_parallel' must be at least 1, got 0",
        ),
        ("requests: [{name: a, vram: 6GiB, gpus: 2}]", "requests[0] (a): unknown key 'gpus'"),
        ("requests: [{name: a, vram: 6GiB, engine: sglang}]", "'engine' must be one of"),
        ("requests: [{name: a, vram: 6GiB, priority: high}]", "'priority' must be a whole"),
        ("requests: [{name: a, vram: 6GiB, min_copies: -1}]", "'min_copies' must be at least 0"),
        ("requests: [{name: a, vram: 2048TiB}]", "'vram' must be at most 1 PiB, got '2048TiB'"),
        (
            "requests: [{name: a, vram: 6GiB, vram: 60GiB}]",
            "not valid YAML (line 1): duplicate key 'vram' (first on line 1)",
        ),
    ],
)
def test_bad_request_files_exit_2_with_one_line(
    tmp_path: Path, requests_text: str, problem: str
) -> None:
    requests = write(tmp_path, "r.yaml", requests_text)
    result = run_cli("plan", str(FLEET), str(requests))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(requests) in lines[0] and problem in lines[0]
    assert "Traceback" not in result.stderr


def test_a_fifo_as_request_file_exits_2_unopened(tmp_path: Path) -> None:
    """With no writer, opening the FIFO would block the command for ever."""
    fifo = tmp_path / "requests.yaml"
    os.mkfifo(fifo)
    result = run_cli("plan", str(FLEET), str(fifo))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {fifo}: request file is not a regular file"


def test_missing_fleet_file_exits_2(tmp_path: Path) -> None:
    result = run_cli("plan", str(tmp_path / "none.yaml"), EXAMPLE_REQUESTS)
    assert result.returncode == 2
    assert "fleet file not found" in result.stderr and "Traceback" not in result.stderr


def test_json_fleet_and_requests_plan_as_the_yaml_ones(tmp_path: Path) -> None:
    """JSON files give the same document as YAML ones; the document parses as one JSON value
    with one placement per line."""
    fleet_json = write(
        tmp_path,
        "f.json",
        json.dumps(
            {
                "nodes": [
                    {
                        "name": "node-a",
                        "gpus": [
                            {
                                "index": 0,
                                "vendor": "nvidia",
                                "product": "Tesla T4",
                                "memory": "16GiB",
                                "accel_version": "12.4",
                            }
                        ],
                    }
                ]
            }
        ),
    )
    requests_json = write(
        tmp_path,
        "r.json",
        json.dumps({"requests": [{"name": n, "vram": "6GiB"} for n in "abc"]}),
    )
    from_json = run_cli("plan", str(fleet_json), str(requests_json), "--json")
    assert from_json.returncode == 0, from_json.stderr
    assert json.loads(from_json.stdout) == plan_t4_example(tmp_path)
    lines = from_json.stdout.splitlines()
    assert len(lines) == 8  # {, "placements": [, three entries, ], "summary", }
    assert json.loads(lines[2].rstrip(","))["name"] == "a"


def test_empty_request_list_is_still_a_json_document(tmp_path: Path) -> None:
    requests = write(tmp_path, "r.json", '{"requests": []}')
    result = run_cli("plan", str(FLEET), str(requests), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"placements": [], "summary": {"placed": 0, "failed": 0}}


@pytest.mark.parametrize(
    "names",
    [
        ["a", 'b, {"name": "c"}', 'd\\", {"name": e', 'é}, {"name": ', "f"],
        ["only"],
        [],
    ],
)
def test_the_json_document_has_one_placement_per_line_whatever_the_names(
    capsys: pytest.CaptureFixture[str], names: list[str]
) -> None:
    """Names holding what separates entries in the encoded list break no line of their own."""
    entries = [{"name": name, "placed": True, "node": name, "details": {}} for name in names]
    document = {"placements": entries, "summary": {"placed": len(names), "failed": 0}}
    write_plan_json(document)
    printed = capsys.readouterr().out
    assert json.loads(printed) == document
    lines = printed.splitlines()
    assert lines[2 : 2 + len(entries)] == [
        f"    {json.dumps(entry)}{',' if at < len(entries) - 1 else ''}"
        for at, entry in enumerate(entries)
    ]


def test_bad_json_request_file_exits_2_with_one_line(tmp_path: Path) -> None:
    requests = write(tmp_path, "r.json", '{"requests": [{"name": "a", "vram": Infinity}]}')
    result = run_cli("plan", str(FLEET), str(requests))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(requests) in lines[0] and "Infinity is not a JSON number" in lines[0]


T4_MEASURED = """
devices:
  - {node: node-a, gpu_index: 0, total: 16GiB, used: 5GiB, free: 11GiB}
"""


def test_a_recorded_measurement_keeps_placement_off_memory_others_hold(tmp_path: Path) -> None:
    """5 GiB used by something outside cohabit on the T4: with 1 GiB headroom, one 6 GiB
    request fits where three did; the NoFit names the foreign memory."""
    fleet = str(write(tmp_path, "f.yaml", T4_FLEET))
    requests = str(write(tmp_path, "r.yaml", T4_REQUESTS))
    measured = str(write(tmp_path, "m.yaml", T4_MEASURED))
    result = run_cli("plan", fleet, requests, "--measured", measured, "--json")
    assert result.returncode == 0, result.stderr
    placements = json.loads(result.stdout)["placements"]
    assert [p["placed"] for p in placements] == [True, False, False]
    assert placements[1]["message"].endswith(
        "; 5 GiB held by processes outside cohabit on node-a gpu 0"
    )
    assert placements[1]["details"]["foreign_bytes"] == 5 * GIB


@pytest.mark.parametrize(
    ("text", "headroom", "message"),
    [
        ("devices: [{node: a, total: 1GiB, used: x, free: 1GiB}]", "1GiB",
         "m.yaml: devices[1].used: cannot read 'x' as a size (examples: 16GiB, 15360MiB, 20GB)"),
        (T4_MEASURED, "lots", "m.yaml: --headroom: cannot read 'lots' as a size"),
    ],
)  # fmt: skip
def test_a_bad_measurement_exits_2_with_one_line(
    tmp_path: Path, text: str, headroom: str, message: str
) -> None:
    fleet = str(write(tmp_path, "f.yaml", T4_FLEET))
    requests = str(write(tmp_path, "r.yaml", T4_REQUESTS))
    measured = write(tmp_path, "m.yaml", text)
    result = run_cli("plan", fleet, requests, "--measured", str(measured), "--headroom", headroom)
    assert result.returncode == 2
    assert f"{tmp_path / message}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
