"""The baseline `cohabit plan --json` is measured against: the same command written as a lean
full scan, the way one would write it without an index.

It reads the fleet and request files with PyYAML's C loader (`yaml.CSafeLoader`; json for
`.json` files), validates nothing, and turns the fleet into flat per-device lists. Each
request then takes one list comprehension over the free budget of every device that passes
its static constraints (vendor, engine, minimum accelerator version; tensor-parallel shards on
whole GPUs only; those device lists are computed once per kind of request), and keeps the
tightest fit (binpack: least free after placing, ties to the lower device); a tensor-parallel
request of N takes the N tightest GPUs of one node and vendor, the node leaving least free
winning. Then it updates the free budgets and prints the document `cohabit plan --json` prints,
one json.dumps per entry. Like `cohabit plan`, it runs with the cyclic garbage collector off.
Same rules and same answers as `cohabit.placement` for what it reads: a standalone cluster's
discrete GPUs and MIG or AMD partitions (pools and whole-GPU or time-slicing modes are
refused).

Run: .venv/bin/python benchmarks/scan_planner.py FLEET REQUESTS
"""

from __future__ import annotations

import gc
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_UNITS |= {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*$")
_VERSION_PART = re.compile(r"\d+")
_VENDORS = ("nvidia", "amd", "apple", "intel", "cpu")
_ENGINE_VENDORS = {
    "vllm": frozenset({"nvidia", "amd"}),
    "mlx": frozenset({"apple"}),
    "llamacpp": frozenset(_VENDORS),
}
_NON_WORD = re.compile(r"[^a-z0-9]+")
GIB = 2**30


def load(path: Path) -> Any:
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)
    return yaml.load(text, Loader=_LOADER)


def size_bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    if match is None:
        raise SystemExit(f"cannot read size {value!r}")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def version_key(version: object) -> tuple[int, ...]:
    return tuple(int(part) for part in _VERSION_PART.findall(str(version)))


class LeanScan:
    """The fleet as flat per-device lists in tie-break order (node order, GPU index,
    partition order), and one full scan per decision."""

    def __init__(self, fleet: dict[str, Any]) -> None:
        if fleet.get("fractional", True) is not True or fleet.get("topology") == "managed_cluster":
            raise SystemExit("the lean scan handles fractional standalone clusters only")
        self.free: list[int] = []
        self.capacity: list[int] = []
        self.exclusive: list[bool] = []
        self.node_of: list[int] = []
        self.vendor: list[str] = []
        self.version: list[tuple[int, ...]] = []
        self.whole_gpu: list[bool] = []
        self.fields: list[dict[str, Any]] = []  # each device's part of a placement's entry
        self.node_names: list[str] = []
        self._eligible: dict[tuple[object, ...], list[int]] = {}
        for node_order, node in enumerate(fleet["nodes"]):
            if set(node) - {"name", "gpus", "schedulable", "unschedulable_reason"}:
                raise SystemExit(f"the lean scan handles discrete GPUs only: {node['name']}")
            self.node_names.append(node["name"])
            if not node.get("schedulable", True):
                continue
            for gpu in sorted(node.get("gpus") or (), key=lambda g: g["index"]):
                vendor = gpu["vendor"]
                version = version_key(gpu.get("accel_version") or "")
                for part in gpu.get("partitions") or ():
                    slug = _NON_WORD.sub("_", part["profile"].lower()).strip("_")
                    prefix = "mig" if vendor == "nvidia" else "partition"
                    self._add(node_order, vendor, version, size_bytes(part["memory"]), True)
                    self.fields.append(
                        {
                            "gpu_indices": [gpu["index"]],
                            "partition": part["profile"],
                            "hardware_class": "hardware_isolated",
                            "sharing_class": f"{prefix}_{slug}",
                        }
                    )
                if not gpu.get("partitions"):
                    self._add(node_order, vendor, version, size_bytes(gpu["memory"]), False)
                    self.fields.append(
                        {
                            "gpu_indices": [gpu["index"]],
                            "partition": None,
                            "hardware_class": "software_shared",
                            "sharing_class": "fractional",
                        }
                    )

    def _add(
        self, node_order: int, vendor: str, version: tuple[int, ...], memory: int, part: bool
    ) -> None:
        self.free.append(memory)
        self.capacity.append(memory)
        self.exclusive.append(part)
        self.node_of.append(node_order)
        self.vendor.append(vendor)
        self.version.append(version)
        self.whole_gpu.append(not part)

    def eligible(self, request: dict[str, Any]) -> list[int]:
        """Devices that pass the request's static constraints, computed once per kind."""
        vendor, engine = request.get("vendor"), request.get("engine")
        minimum = request.get("min_accel_version")
        sharded = request.get("tensor_parallel", 1) > 1
        kind = (vendor, engine, minimum, sharded)
        found = self._eligible.get(kind)
        if found is None:
            vendors = _ENGINE_VENDORS.get(engine or "", frozenset(_VENDORS))
            if vendor is not None:
                vendors = vendors & {vendor.lower()}
            least = version_key(minimum) if minimum is not None else ()
            found = [
                i
                for i in range(len(self.free))
                if self.vendor[i] in vendors
                and self.version[i] >= least
                and (self.whole_gpu[i] or not sharded)
            ]
            self._eligible[kind] = found
        return found

    def place(self, request: dict[str, Any], need: int) -> list[int] | None:
        """The devices chosen for `request` of `need` bytes per shard (their free budgets
        updated), or None."""
        shards = request.get("tensor_parallel", 1)
        free = self.free
        fits = [(free[i], i) for i in self.eligible(request) if free[i] >= need]
        if not fits:
            return None
        if shards == 1:
            chosen = [min(fits)[1]]
        else:
            by_node: dict[tuple[int, str], list[tuple[int, int]]] = {}
            for fit in fits:
                i = fit[1]
                by_node.setdefault((self.node_of[i], self.vendor[i]), []).append(fit)
            best: tuple[int, int] | None = None
            for (node_order, _), node_fits in by_node.items():
                if len(node_fits) >= shards:
                    node_fits.sort()
                    key = (sum(f for f, _ in node_fits[:shards]) - shards * need, node_order)
                    if best is None or key < best:
                        best, picked = key, node_fits[:shards]
            if best is None:
                return None
            chosen = sorted(i for _, i in picked)
        for i in chosen:
            free[i] -= self.capacity[i] if self.exclusive[i] else need
        return chosen

    def entry(self, request: dict[str, Any], need: int, chosen: list[int] | None) -> dict[str, Any]:
        """The request's entry in the plan document."""
        if chosen is None:
            return {
                "name": request["name"],
                "placed": False,
                "reason": "insufficient_capacity",
                "message": f"no node has room for {request['name']}",
            }
        first = self.fields[chosen[0]]
        allocated = max(self.capacity[i] if self.exclusive[i] else need for i in chosen)
        return {
            "name": request["name"],
            "placed": True,
            "node": self.node_names[self.node_of[chosen[0]]],
            "gpu_indices": [self.fields[i]["gpu_indices"][0] for i in chosen],
            "partition": first["partition"],
            "hardware_class": first["hardware_class"],
            "sharing_class": first["sharing_class"],
            "allocated_bytes": allocated,
            "allocated_capacity_gb": -(-allocated // GIB),
            "notices": [],
        }


def plan(fleet: dict[str, Any], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every request in file order against what the previous ones left: the document's
    entries."""
    scan = LeanScan(fleet)
    entries = []
    for request in requests:
        need = size_bytes(request["vram"])
        entries.append(scan.entry(request, need, scan.place(request, need)))
    return entries


def write_document(entries: list[dict[str, Any]]) -> None:
    """The document as `cohabit plan --json` lays it out: one entry per line."""
    placed = sum(1 for e in entries if e["placed"])
    lines = ",\n".join("    " + json.dumps(e) for e in entries)
    summary = json.dumps({"placed": placed, "failed": len(entries) - placed})
    sys.stdout.write(f'{{\n  "placements": [\n{lines}\n  ],\n  "summary": {summary}\n}}\n')


def main() -> None:
    # As `cohabit plan` does: nothing here makes a cycle, and the collector's passes over
    # what PyYAML builds would only slow the scan's parsing.
    gc.disable()
    fleet_path, requests_path = Path(sys.argv[1]), Path(sys.argv[2])
    write_document(plan(load(fleet_path), load(requests_path)["requests"]))


if __name__ == "__main__":
    main()
