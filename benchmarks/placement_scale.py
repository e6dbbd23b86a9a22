"""How placement scales.

1. 20,000 requests planned online on 1,000 nodes × 8 GPUs: decisions per second and the
   latency distribution of one decision.
2. Time per decision on fleets of about 100, 1,000 and 10,000 GPUs (the index keeps it nearly
   flat; the scanning baseline grows with the fleet).
3. The whole `cohabit plan --json` run (parse the files, plan, print) on 12,000 requests and
   3,200 GPUs, from YAML and from JSON files, against the same run — same files, same parsing,
   same output — with a planner that scans every device per request; and where the time of
   our run goes (parsing each file, planning, writing the document), measured in-process.

Run: .venv/bin/python benchmarks/placement_scale.py  (prints a table, then one JSON line)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))

from cohabit.hardware.fleetfile import dump_fleet, fleet_to_dict
from cohabit.placement.planner import Planner
from cohabit.placement.state import FleetState
from cohabit.units import GIB
from fleetgen import random_fleet, random_requests
from scan_planner import ScanPlanner


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


def flatness() -> list[dict[str, float]]:
    rows = []
    for nodes in (13, 125, 1250):
        fleet = random_fleet(nodes, 8, seed=nodes)
        gpus = nodes * 8
        requests = random_requests(min(2 * gpus, 20_000), seed=nodes)
        ours = time_decisions(Planner(FleetState(fleet=fleet)), requests)
        # The scan is slow on big fleets: time the first decisions only, which is where a scan
        # is cheapest (nothing is full yet, so it never walks a failure path).
        sample = requests[: min(len(requests), 300)]
        scan = time_decisions(ScanPlanner(FleetState(fleet=fleet)), sample)
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


def write_inputs(directory: Path, fmt: str = "yaml") -> tuple[Path, Path]:
    """The fleet and request files, as YAML or as JSON (same content)."""
    fleet_path = directory / f"fleet.{fmt}"
    requests_path = directory / f"requests.{fmt}"
    fleet = random_fleet(400, 8, seed=3)
    fleet_path.write_text(json.dumps(fleet_to_dict(fleet)) if fmt == "json" else dump_fleet(fleet))
    entries = []
    for r in random_requests(12_000, seed=5):
        entry: dict[str, object] = {"name": r.name, "vram": f"{r.vram_bytes // (GIB // 1024)}MiB"}
        if r.tensor_parallel > 1:
            entry["tensor_parallel"] = r.tensor_parallel
        if r.vendor is not None:
            entry["vendor"] = r.vendor.value
        if r.min_accel_version is not None:
            entry["min_accel_version"] = r.min_accel_version
        if r.engine is not None:
            entry["engine"] = r.engine
        entries.append(entry)
    document = {"requests": entries}
    requests_path.write_text(
        json.dumps(document) if fmt == "json" else yaml.safe_dump(document, sort_keys=False)
    )
    return fleet_path, requests_path


def scan_run(fleet_path: Path, requests_path: Path) -> None:
    """`cohabit plan --json` with the scanning planner in place of the real one."""
    from cohabit.cli.plan import plan_document, write_plan_json
    from cohabit.cli.requestfile import load_requests
    from cohabit.hardware.fleetfile import load_fleet

    planner = ScanPlanner(FleetState(fleet=load_fleet(fleet_path)))
    decisions = [planner.place(r) for r in load_requests(requests_path)]
    write_plan_json(plan_document(decisions))


def whole_run(runs: int = 3) -> dict[str, float]:
    """Each command as a fresh process, best of `runs` for ours, once for the slow baseline."""
    result: dict[str, float] = {"requests": 12_000, "gpus": 3_200}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("yaml", "json"):
            fleet_path, requests_path = write_inputs(Path(tmp), fmt)
            commands = {
                f"cohabit_plan_{fmt}_s": [sys.executable, "-m", "cohabit", "plan"],
                f"scan_plan_{fmt}_s": [sys.executable, __file__, "--scan-run"],
            }
            for label, command in commands.items():
                best = float("inf")
                for _ in range(runs if label.startswith("cohabit") else 1):
                    t0 = time.perf_counter()
                    subprocess.run(
                        [*command, str(fleet_path), str(requests_path), "--json"],
                        check=True,
                        stdout=subprocess.DEVNULL,
                        env={**os.environ, "PYTHONHASHSEED": "0"},
                    )
                    best = min(best, time.perf_counter() - t0)
                result[label] = round(best, 2)
            result[f"ratio_{fmt}"] = round(
                result[f"cohabit_plan_{fmt}_s"] / result[f"scan_plan_{fmt}_s"], 3
            )
            result |= {f"{fmt}_{k}": v for k, v in phases(fleet_path, requests_path).items()}
    return result


def phases(fleet_path: Path, requests_path: Path) -> dict[str, float]:
    """Where `cohabit plan --json` spends its time, in-process (seconds, best of 3)."""
    from cohabit.cli.plan import plan_document, write_plan_json
    from cohabit.cli.requestfile import load_requests
    from cohabit.hardware.fleetfile import load_fleet
    from cohabit.placement.planner import plan_online

    best: dict[str, float] = {}
    for _ in range(3):
        t0 = time.perf_counter()
        fleet = load_fleet(fleet_path)
        t1 = time.perf_counter()
        requests = load_requests(requests_path)
        t2 = time.perf_counter()
        decisions = plan_online(FleetState(fleet=fleet), requests)
        t3 = time.perf_counter()
        with open(os.devnull, "w") as sink:
            stdout, sys.stdout = sys.stdout, sink
            try:
                write_plan_json(plan_document(decisions))
            finally:
                sys.stdout = stdout
        t4 = time.perf_counter()
        for key, value in (
            ("parse_fleet_s", t1 - t0),
            ("parse_requests_s", t2 - t1),
            ("plan_s", t3 - t2),
            ("write_json_s", t4 - t3),
        ):
            best[key] = round(min(best.get(key, float("inf")), value), 3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scan-run", nargs=2, metavar=("FLEET", "REQUESTS"))
    parser.add_argument("--json", action="store_true", help="(with --scan-run) ignored")
    parser.add_argument("--quick", action="store_true", help="skip the whole-run comparison")
    args = parser.parse_args()
    if args.scan_run:
        scan_run(Path(args.scan_run[0]), Path(args.scan_run[1]))
        return
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
    print("2. Time per decision by fleet size (indexed vs scanning every device)")
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
    print("3. Whole `cohabit plan --json` run, 12,000 requests on 3,200 GPUs (best of 3)")
    for fmt in ("yaml", "json"):
        print(
            f"   {fmt}: cohabit {run[f'cohabit_plan_{fmt}_s']} s, scanning planner "
            f"{run[f'scan_plan_{fmt}_s']} s, ratio {run[f'ratio_{fmt}']} (target <= 0.2); "
            f"parse fleet {run[f'{fmt}_parse_fleet_s']} s, requests "
            f"{run[f'{fmt}_parse_requests_s']} s, plan {run[f'{fmt}_plan_s']} s, "
            f"write JSON {run[f'{fmt}_write_json_s']} s"
        )
    print(json.dumps({"headline": top, "flatness": rows, "whole_run": run}))


if __name__ == "__main__":
    main()
