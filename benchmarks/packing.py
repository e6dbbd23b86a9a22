"""How close batch planning gets to the best possible packing.

On oversubscribed random fleets of 3–7 GPUs (discrete cards, some with MIG partitions),
compare the number of requests placed by online order, a smallest-first greedy and
`plan_batch()` (`cohabit plan --batch`) with the exact optimum from scipy's MILP solver.

Run: .venv/bin/python benchmarks/packing.py [--instances 200]  (prints a table, then JSON)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.placement.batch import plan_batch
from cohabit.placement.planner import plan_online
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.units import GIB

CARD_GIB = [16, 24, 40, 48, 80]


def random_instance(rng: random.Random) -> tuple[FleetState, list[PlacementRequest]]:
    gpus = []
    for index in range(rng.randint(3, 7)):
        memory = rng.choice(CARD_GIB)
        partitions: tuple[Partition, ...] = ()
        if memory in (40, 80) and rng.random() < 0.2:
            half = memory // 2
            partitions = (
                Partition(profile="half", memory_bytes=half * GIB),
                Partition(profile="quarter", memory_bytes=half // 2 * GIB),
            )
        gpus.append(
            Gpu(
                index=index,
                vendor=Vendor.NVIDIA,
                product="gpu",
                memory_bytes=memory * GIB,
                partitions=partitions,
            )
        )
    state = FleetState(fleet=Fleet(nodes=(Node(name="n", gpus=tuple(gpus)),)))
    capacity = sum(s.capacity_bytes for s in state.slots)
    requests: list[PlacementRequest] = []
    target = capacity * rng.uniform(1.2, 2.0)
    while sum(r.vram_bytes for r in requests) < target:
        size_gib = min(40.0, max(1.0, rng.lognormvariate(2.0, 0.8)))
        # Whole-MiB sizes, as budgets are written.
        requests.append(
            PlacementRequest(
                name=f"r{len(requests)}", vram_bytes=int(size_gib * 1024) * (GIB // 1024)
            )
        )
    return state, requests


def optimum(state: FleetState, requests: list[PlacementRequest]) -> int:
    """Most requests placed: x[i, j] = request i on slot j; each request at most once; shared
    slots hold up to their capacity, partitions one request that fits."""
    slots = state.slots
    n, m = len(requests), len(slots)
    sizes = np.array([r.vram_bytes / GIB for r in requests])
    fits = np.array(
        [[sizes[i] <= slots[j].capacity_bytes / GIB for j in range(m)] for i in range(n)]
    )
    rows, lower, upper = [], [], []
    for i in range(n):  # each request at most once
        row = np.zeros((n, m))
        row[i, :] = 1
        rows.append(row.ravel())
        lower.append(0)
        upper.append(1)
    for j, slot in enumerate(slots):
        row = np.zeros((n, m))
        if slot.exclusive:
            row[:, j] = 1
            bound = 1.0
        else:
            row[:, j] = sizes
            bound = slot.capacity_bytes / GIB
        rows.append(row.ravel())
        lower.append(0)
        upper.append(bound)
    result = milp(
        c=-np.ones(n * m),
        constraints=LinearConstraint(np.array(rows), lower, upper),
        integrality=np.ones(n * m),
        bounds=Bounds(0, fits.ravel().astype(float)),
        options={"time_limit": 60},
    )
    if not result.success:
        raise RuntimeError(f"MILP did not solve: {result.message}")
    return round(-result.fun)


def placed(decisions: list) -> int:  # type: ignore[type-arg]
    return sum(1 for d in decisions if d.placed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    totals = {"optimum": 0, "batch": 0, "online": 0, "smallest_first": 0}
    worst = {"batch": 1.0, "online": 1.0, "smallest_first": 1.0}
    batch_seconds: list[float] = []
    for _ in range(args.instances):
        state, requests = random_instance(rng)
        best = optimum(state, requests)
        t0 = time.perf_counter()
        batch = placed(plan_batch(state, requests))
        batch_seconds.append(time.perf_counter() - t0)
        counts = {
            "batch": batch,
            "online": placed(plan_online(state, requests)),
            "smallest_first": placed(
                plan_online(state, sorted(requests, key=lambda r: r.vram_bytes))
            ),
        }
        if batch > best:
            raise RuntimeError("batch beat the optimum: the MILP model is wrong")
        totals["optimum"] += best
        for name, count in counts.items():
            totals[name] += count
            if best:
                worst[name] = min(worst[name], count / best)
    figures = {
        "instances": args.instances,
        "optimum_placed": totals["optimum"],
        **{
            f"{name}_overall": round(totals[name] / totals["optimum"], 4)
            for name in ("batch", "online", "smallest_first")
        },
        **{f"{name}_worst_instance": round(worst[name], 4) for name in worst},
        "batch_mean_ms": round(statistics.fmean(batch_seconds) * 1000, 1),
        "batch_max_ms": round(max(batch_seconds) * 1000, 1),
    }
    print(
        f"{args.instances} oversubscribed fleets of 3-7 GPUs; requests placed vs the MILP optimum"
    )
    print("   planner          overall   worst instance")
    for name in ("batch", "smallest_first", "online"):
        overall, worst_one = figures[f"{name}_overall"], figures[f"{name}_worst_instance"]
        print(f"   {name:<15} {overall:>8.2%}   {worst_one:>8.2%}")
    print(
        f"   batch planning time: mean {figures['batch_mean_ms']} ms, "
        f"max {figures['batch_max_ms']} ms"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
