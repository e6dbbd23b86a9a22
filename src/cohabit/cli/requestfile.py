"""Request files for `cohabit plan`: a YAML list of what to place.

    requests:
      - {name: a, vram: 6GiB, tensor_parallel: 1, vendor: nvidia, min_accel_version: "12.1"}

`vram` is the budget per shard. Mistakes are one `FileProblem` line naming the entry.
"""

from __future__ import annotations

from pathlib import Path

from cohabit.hardware.model import Vendor
from cohabit.placement.errors import InvalidRequest
from cohabit.placement.request import ENGINE_VENDORS, PlacementRequest
from cohabit.yamlfile import Entry, FileProblem, load_mapping

_KEYS = ("name", "vram", "tensor_parallel", "vendor", "min_accel_version", "engine")


def load_requests(path: Path) -> list[PlacementRequest]:
    """Read and check a request file.

    Raises:
        FileProblem: unreadable file, unknown key, missing or non-positive size, duplicate
            name, tensor_parallel below 1, unknown vendor or engine.
    """
    top = Entry(path, "", load_mapping(path, what="request file"))
    top.check_keys(("requests",), required=("requests",))
    requests: list[PlacementRequest] = []
    seen: set[str] = set()
    for entry in top.entries("requests"):
        request = _request(entry)
        if request.name in seen:
            entry.fail(f"duplicate request name {request.name!r}")
        seen.add(request.name)
        requests.append(request)
    return requests


def _request(entry: Entry) -> PlacementRequest:
    entry.check_keys(_KEYS, required=("name", "vram"))
    vendor_text = entry.string("vendor")
    vendor = None
    if vendor_text is not None:
        try:
            vendor = Vendor(vendor_text.lower())
        except ValueError:
            entry.fail(
                f"'vendor' must be one of {', '.join(v.value for v in Vendor)}, got {vendor_text!r}"
            )
    engine = entry.string("engine")
    if engine is not None and engine not in ENGINE_VENDORS:
        entry.fail(f"'engine' must be one of {', '.join(sorted(ENGINE_VENDORS))}, got {engine!r}")
    version = entry.data.get("min_accel_version")
    try:
        return PlacementRequest(
            name=entry.required_string("name"),
            vram_bytes=entry.required_size("vram"),
            tensor_parallel=entry.integer("tensor_parallel", 1, minimum=1) or 1,
            vendor=vendor,
            min_accel_version=None if version is None else str(version),
            engine=engine,
        )
    except InvalidRequest as exc:
        entry.fail(str(exc))


__all__ = ["FileProblem", "load_requests"]
