"""How placement scales.

1. 20,000 requests planned online on 1,000 nodes × 8 GPUs: decisions per second and the
   latency distribution of one decision.
2. Time per decision on fleets of about 100, 1,000 and 10,000 GPUs (the index keeps it nearly
   flat; the lean full scan of scan_planner.py grows with the fleet).
3. The whole `cohabit plan --json` run (parse the files, plan, print) on 12,000 requests and
   3,200 GPUs, from YAML and from JSON files, against scan_planner.py run on the same files —
   a lean full scan written as one would write it without an index — each a fresh process,
   the two taking turns; whether both placed every request alike; and where the time of each
   goes (parsing each file, planning, writing the document), measured in-process.

Run: .venv/bin/python benchmarks/placement_scale.py  (prints a table, then one JSON line)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))

import scan_planner
from cohabit.hardware.fleetfile import dump_fleet, fleet_to_dict
from cohabit.placement.planner import Planner
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.units import GIB
from fleetgen import random_fleet, random_requests


def _percentile_us(latencies_ns: list[int], fraction: float) -> float:
    if not latencies_ns:
        return 0.0
    ordered = sorted(latencies_ns)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1000, 1)


def time_decisions(planner, requests) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Time each decision; report all of them and, apart, single-GPU and tensor-parallel ones."""
    latencies: list[int] = []
    single: list[int] = []
    sharded: list[int] = []
    placed = 0
    start = time.perf_counter()
    for request in requests:
        t0 = time.perf_counter_ns()
        decision = planner.place(request)
        elapsed = time.perf_counter_ns() - t0
        latencies.append(elapsed)
        (single if request.tensor_parallel == 1 else sharded).append(elapsed)
        placed += decision.placed
    total = time.perf_counter() - start
    return {
        "decisions": len(requests),
        "placed": placed,
        "seconds": round(total, 3),
        "decisions_per_s": round(len(requests) / total),
        "mean_us": round(statistics.fmean(latencies) / 1000, 1),
        "p50_us": _percentile_us(latencies, 0.5),
        "p99_us": _percentile_us(latencies, 0.99),
        "tp1_mean_us": round(statistics.fmean(single) / 1000, 1) if single else 0.0,
        "tp1_p99_us": _percentile_us(single, 0.99),
        "tp_multi_mean_us": round(statistics.fmean(sharded) / 1000, 1) if sharded else 0.0,
        "tp_multi_p99_us": _percentile_us(sharded, 0.99),
    }


def headline() -> dict[str, float]:
    fleet = random_fleet(1000, 8)
    planner = Planner(FleetState(fleet=fleet))
    return time_decisions(planner, random_requests(20_000))


def time_scan(fleet: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, float]:
    """The lean scan's time per decision (µs), mean and p99."""
    scan = scan_planner.LeanScan(fleet)
    latencies: list[int] = []
    for entry in entries:
        need = scan_planner.size_bytes(entry["vram"])  # read with the file, as cohabit's is
        t0 = time.perf_counter_ns()
        scan.place(entry, need)
        latencies.append(time.perf_counter_ns() - t0)
    return {
        "mean_us": round(statistics.fmean(latencies) / 1000, 1),
        "p99_us": _percentile_us(latencies, 0.99),
    }


def flatness() -> list[dict[str, float]]:
    rows = []
    for nodes in (13, 125, 1250):
        fleet = random_fleet(nodes, 8, seed=nodes)
        gpus = nodes * 8
        requests = random_requests(min(2 * gpus, 20_000), seed=nodes)
        ours = time_decisions(Planner(FleetState(fleet=fleet)), requests)
        # The scan is slow on big fleets: time the first decisions only, which is where a scan
        # is cheapest (nothing is full yet, so it never walks a failure path).
        sample = [request_entry(r) for r in requests[: min(len(requests), 300)]]
        scan = time_scan(fleet_to_dict(fleet), sample)
        rows.append(
            {
                "gpus": gpus,
                "requests": len(requests),
                "indexed_mean_us": ours["mean_us"],
                "indexed_p99_us": ours["p99_us"],
                "indexed_tp1_mean_us": ours["tp1_mean_us"],
                "indexed_tp1_p99_us": ours["tp1_p99_us"],
                "indexed_tp_multi_mean_us": ours["tp_multi_mean_us"],
                "scan_mean_us": scan["mean_us"],
                "scan_p99_us": scan["p99_us"],
            }
        )
    return rows


def request_entry(request: PlacementRequest) -> dict[str, Any]:
    """A request as a request file's entry."""
    entry: dict[str, Any] = {
        "name": request.name,
        "vram": f"{request.vram_bytes // (GIB // 1024)}MiB",
    }
    if request.tensor_parallel > 1:
        entry["tensor_parallel"] = request.tensor_parallel
    if request.vendor is not None:
        entry["vendor"] = request.vendor.value
    if request.min_accel_version is not None:
        entry["min_accel_version"] = request.min_accel_version
    if request.engine is not None:
        entry["engine"] = request.engine
    return entry


def write_inputs(directory: Path, fmt: str = "yaml") -> tuple[Path, Path]:
    """The fleet and request files, as YAML or as JSON (same content)."""
    fleet_path = directory / f"fleet.{fmt}"
    requests_path = directory / f"requests.{fmt}"
    fleet = random_fleet(400, 8, seed=3)
    fleet_path.write_text(json.dumps(fleet_to_dict(fleet)) if fmt == "json" else dump_fleet(fleet))
    document = {"requests": [request_entry(r) for r in random_requests(12_000, seed=5)]}
    requests_path.write_text(
        json.dumps(document) if fmt == "json" else yaml.safe_dump(document, sort_keys=False)
    )
    return fleet_path, requests_path


def _timed_run(command: list[str]) -> tuple[float, str]:
    """Wall time of one fresh process, and what it printed. Python keeps its bytecode cache
    as it does for a user (a setting that turns it off would make every run compile the
    modules changed since their cache was last written)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    done = subprocess.run(
        command,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONHASHSEED": "0"},
    )
    return time.perf_counter() - t0, done.stdout


def agreement(ours: str, scan: str) -> dict[str, int]:
    """How many entries of the two documents are the same placement (every field) or both a
    refusal of the same request."""
    a, b = json.loads(ours)["placements"], json.loads(scan)["placements"]
    same = sum(
        1
        for x, y in zip(a, b, strict=False)
        if x == y or (x["name"] == y["name"] and not x["placed"] and not y["placed"])
    )
    return {
        "entries": len(a),
        "agree": same if len(a) == len(b) else 0,
        "placed": sum(1 for x in a if x["placed"]),
        "scan_placed": sum(1 for y in b if y["placed"]),
    }


def whole_run(runs: int = 5) -> dict[str, Any]:
    """Each command as a fresh process, best of `runs`, ours and the scan taking turns so
    that what else runs on the machine weighs on both alike."""
    result: dict[str, Any] = {
        "requests": 12_000,
        "gpus": 3_200,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    scan_script = str(Path(__file__).parent / "scan_planner.py")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("tiny", "yaml", "json"):
            if fmt == "tiny":  # what starting each command costs: one GPU, one request
                fleet_path, requests_path = Path(tmp) / "f.yaml", Path(tmp) / "r.yaml"
                fleet_path.write_text(dump_fleet(random_fleet(1, 1)))
                requests_path.write_text("requests:\n- name: a\n  vram: 1GiB\n")
            else:
                fleet_path, requests_path = write_inputs(Path(tmp), fmt)
            files = [str(fleet_path), str(requests_path)]
            commands = {
                "cohabit": [sys.executable, "-m", "cohabit", "plan", *files, "--json"],
                "scan": [sys.executable, scan_script, *files],
            }
            best = {label: float("inf") for label in commands}
            printed = {}
            for _ in range(runs):
                for label, command in commands.items():
                    seconds, printed[label] = _timed_run(command)
                    best[label] = min(best[label], seconds)
            if fmt == "tiny":
                result["start_cohabit_s"] = round(best["cohabit"], 3)
                result["start_scan_s"] = round(best["scan"], 3)
                continue
            result[f"cohabit_plan_{fmt}_s"] = round(best["cohabit"], 2)
            result[f"scan_plan_{fmt}_s"] = round(best["scan"], 2)
            result[f"ratio_{fmt}"] = round(best["cohabit"] / best["scan"], 3)
            result[f"agreement_{fmt}"] = agreement(printed["cohabit"], printed["scan"])
            result |= {f"{fmt}_{k}": v for k, v in phases(fleet_path, requests_path).items()}
            result |= {f"{fmt}_scan_{k}": v for k, v in scan_phases(*files).items()}
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def phases(fleet_path: Path, requests_path: Path) -> dict[str, float]:
    """Where `cohabit plan --json` spends its time, in-process (seconds, best of 3), with the
    cyclic garbage collector off as in both commands."""
    from cohabit.cli.plan import plan_document, write_plan_json
    from cohabit.cli.requestfile import load_requests
    from cohabit.hardware.fleetfile import load_fleet
    from cohabit.placement.planner import plan_online

    best: dict[str, float] = {}
    for _ in range(3):
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        fleet = load_fleet(fleet_path)
        t1 = time.perf_counter()
        requests = load_requests(requests_path)
        t2 = time.perf_counter()
        decisions = plan_online(FleetState(fleet=fleet), requests)
        t3 = time.perf_counter()
        with _stdout_to_devnull():
            write_plan_json(plan_document(decisions))
        t4 = time.perf_counter()
        gc.enable()
        _keep_best(best, t0, t1, t2, t3, t4)
    return best


def scan_phases(fleet_path: str, requests_path: str) -> dict[str, float]:
    """The same for the lean scan (best of 2)."""
    best: dict[str, float] = {}
    for _ in range(2):
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        fleet = scan_planner.load(Path(fleet_path))
        t1 = time.perf_counter()
        requests = scan_planner.load(Path(requests_path))["requests"]
        t2 = time.perf_counter()
        entries = scan_planner.plan(fleet, requests)
        t3 = time.perf_counter()
        with _stdout_to_devnull():
            scan_planner.write_document(entries)
        t4 = time.perf_counter()
        gc.enable()
        _keep_best(best, t0, t1, t2, t3, t4)
    return best


def _keep_best(best: dict[str, float], *marks: float) -> None:
    names = ("parse_fleet_s", "parse_requests_s", "plan_s", "write_json_s")
    for name, start, end in zip(names, marks, marks[1:], strict=False):
        best[name] = round(min(best.get(name, float("inf")), end - start), 3)


@contextmanager
def _stdout_to_devnull() -> Iterator[None]:
    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            yield
        finally:
            sys.stdout = stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the whole-run comparison")
    args = parser.parse_args()
    top = headline()
    print("1. 20,000 requests on 1,000 nodes x 8 GPUs (online, binpack)")
    print(
        f"   {top['decisions_per_s']:,} decisions/s, mean {top['mean_us']} us, "
        f"p50 {top['p50_us']} us, p99 {top['p99_us']} us, placed {top['placed']:,}"
    )
    print(
        f"   single-GPU: mean {top['tp1_mean_us']} us, p99 {top['tp1_p99_us']} us; "
        f"tensor-parallel: mean {top['tp_multi_mean_us']} us, p99 {top['tp_multi_p99_us']} us"
    )
    rows = flatness()
    print("2. Time per decision by fleet size (indexed vs a lean scan of every device)")
    print(
        "   GPUs  requests | indexed mean/p99 us | TP=1 mean/p99 us | TP>1 mean us "
        "| scan mean/p99 us"
    )
    for row in rows:
        print(
            f"   {row['gpus']:>5} {row['requests']:>8} | "
            f"{row['indexed_mean_us']:>7} / {row['indexed_p99_us']:<9} | "
            f"{row['indexed_tp1_mean_us']:>6} / {row['indexed_tp1_p99_us']:<7} | "
            f"{row['indexed_tp_multi_mean_us']:>12} | "
            f"{row['scan_mean_us']:>8} / {row['scan_p99_us']}"
        )
    if args.quick:
        print(json.dumps({"headline": top, "flatness": rows}))
        return
    run = whole_run()
    print(
        "3. Whole `cohabit plan --json` run, 12,000 requests on 3,200 GPUs, against the lean "
        f"scan (best of 5 each; load average {run['load_average_start']} at the start, "
        f"{run['load_average_end']} at the end)"
    )
    for fmt in ("yaml", "json"):
        same = run[f"agreement_{fmt}"]
        print(
            f"   {fmt}: cohabit {run[f'cohabit_plan_{fmt}_s']} s, lean scan "
            f"{run[f'scan_plan_{fmt}_s']} s, ratio {run[f'ratio_{fmt}']} (target <= 0.2); "
            f"placements agree: {same['agree']:,} of {same['entries']:,} "
            f"(placed {same['placed']:,} and {same['scan_placed']:,})"
        )
        for who, prefix in (("cohabit", f"{fmt}_"), ("lean scan", f"{fmt}_scan_")):
            print(
                f"      {who:>9}: parse fleet {run[prefix + 'parse_fleet_s']} s, requests "
                f"{run[prefix + 'parse_requests_s']} s, plan {run[prefix + 'plan_s']} s, "
                f"write JSON {run[prefix + 'write_json_s']} s"
            )
    print(
        f"   start (one GPU, one request): cohabit {run['start_cohabit_s']} s, "
        f"lean scan {run['start_scan_s']} s"
    )
    print(json.dumps({"headline": top, "flatness": rows, "whole_run": run}))
    if any(
        run[f"agreement_{fmt}"]["agree"] != run[f"agreement_{fmt}"]["entries"]
        for fmt in ("yaml", "json")
    ):
        raise SystemExit("cohabit and the lean scan placed some requests differently")


if __name__ == "__main__":
    main()
