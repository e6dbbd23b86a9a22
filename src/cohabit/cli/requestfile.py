"""Request files for `cohabit plan`: a YAML list of what to place.

    requests:
      - {name: a, vram: 6GiB, tensor_parallel: 1, vendor: nvidia, min_accel_version: "12.1"}
      - {name: b, vram: 8GiB, priority: 5, min_copies: 0}

`vram` is the budget per shard. `priority` and `min_copies` (0: may be unloaded for an equal
priority) make the plan unload idle lower ones for a request that does not fit, as the
control plane does. Mistakes are one `FileProblem` line naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cohabit.hardware.model import Vendor
from cohabit.placement.errors import InvalidRequest
from cohabit.placement.request import ENGINE_VENDORS, PlacementRequest
from cohabit.yamlfile import Entry, FileProblem, load_mapping

_RANK_KEYS = frozenset(("priority", "min_copies"))
_KEYS = frozenset(
    ("name", "vram", "tensor_parallel", "vendor", "min_accel_version", "engine", *_RANK_KEYS)
)
_VENDORS = {vendor.value: vendor for vendor in Vendor}


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFile:
    """The requests in file order, and the priority and scale-to-zero flag of each by name.
    `ranked`: some entry gave a priority or min_copies (the plan then preempts)."""

    requests: tuple[PlacementRequest, ...]
    priorities: Mapping[str, int]
    scale_to_zero: frozenset[str]
    ranked: bool


def load_requests(path: Path) -> list[PlacementRequest]:
    """The requests of a request file, in order (see `load_request_file`)."""
    return list(load_request_file(path).requests)


def load_request_file(path: Path) -> RequestFile:
    """Read and check a request file.

    Raises:
        FileProblem: unreadable file, unknown key, missing or non-positive size, duplicate
            name, tensor_parallel below 1, min_copies below 0, a priority that is not a whole
            number, unknown vendor or engine.
    """
    top = Entry(path, "", load_mapping(path, what="request file"))
    top.check_keys(("requests",), required=("requests",))
    requests: list[PlacementRequest] = []
    priorities: dict[str, int] = {}
    scale_to_zero: set[str] = set()
    ranked = False
    for entry in top.entries("requests"):
        request = _request(entry)
        if request.name in priorities:
            entry.fail(f"duplicate request name {request.name!r}")
        if _RANK_KEYS.isdisjoint(entry.data):
            priorities[request.name] = 0
        else:
            ranked = True
            priorities[request.name] = entry.integer("priority", 0, minimum=-(2**31)) or 0
            if entry.integer("min_copies", 1) == 0:
                scale_to_zero.add(request.name)
        requests.append(request)
    return RequestFile(
        requests=tuple(requests),
        priorities=priorities,
        scale_to_zero=frozenset(scale_to_zero),
        ranked=ranked,
    )


def _request(entry: Entry) -> PlacementRequest:
    entry.check_keys(_KEYS, required=("name", "vram"))
    vendor_text = entry.string("vendor")
    vendor = None
    if vendor_text is not None:
        vendor = _VENDORS.get(vendor_text.lower())
        if vendor is None:
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


__all__ = ["FileProblem", "RequestFile", "load_request_file", "load_requests"]
