"""The node agent's memory report: what each device of a node has in use, free, and held by
processes outside cohabit, carried as one node annotation that the control plane reads.

`cohabit.dev/memory` holds a small versioned JSON document::

    {"version": 1, "at": "2026-12-01T06:00:00+00:00", "interval_s": 5.0, "heartbeat_s": 30.0,
     "devices": [{"gpu_index": 0, "partition_index": null, "total_bytes": …,
                  "used_bytes": …, "free_bytes": …, "cohabit_bytes": …, "foreign_bytes": …}]}

`at` is when the figures were sampled; the agent samples every `interval_s` and writes only
when a figure moved meaningfully, and at least every `heartbeat_s`, so an unchanged report is
at most `heartbeat_s` old. Past `heartbeat_s` plus `STALE_PASSES` samples the agent is
taken to be gone and the report is not used. A pool (CPU or unified memory) has
`gpu_index` null. `foreign_bytes` = used − cohabit: on a pool it includes the OS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cohabit.hardware.usage import DeviceUsage

ANNOTATION_MEMORY = "cohabit.dev/memory"
VERSION = 1
STALE_PASSES = 3  # samples an agent may miss beyond its heartbeat before its report is stale
_SIZES = ("total_bytes", "used_bytes", "free_bytes", "cohabit_bytes", "foreign_bytes")


class ReportError(ValueError):
    """An annotation that is not a report this version can read; the message says why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMemory:
    """One node's report: its devices as measured at `at` (each with `cohabit_bytes` set)."""

    at: datetime
    interval_s: float
    heartbeat_s: float
    devices: tuple[DeviceUsage, ...]

    @property
    def stale_after_s(self) -> float:
        return self.heartbeat_s + STALE_PASSES * self.interval_s

    def age_s(self, now: datetime) -> float:
        return max(0.0, (now - self.at).total_seconds())

    def stale(self, now: datetime) -> bool:
        return self.age_s(now) > self.stale_after_s

    def to_annotation(self) -> str:
        devices = [
            {
                "gpu_index": device.gpu_index,
                "partition_index": device.partition_index,
                "total_bytes": device.total_bytes,
                "used_bytes": device.used_bytes,
                "free_bytes": device.free_bytes,
                "cohabit_bytes": device.cohabit_bytes or 0,
                "foreign_bytes": foreign_bytes(device),
            }
            for device in self.devices
        ]
        document = {
            "version": VERSION,
            "at": self.at.isoformat(),
            "interval_s": self.interval_s,
            "heartbeat_s": self.heartbeat_s,
            "devices": devices,
        }
        return json.dumps(document, separators=(",", ":"))


def foreign_bytes(device: DeviceUsage) -> int:
    """Used memory that cohabit's engines do not account for."""
    return max(0, device.used_bytes - (device.cohabit_bytes or 0))


def moved(before: NodeMemory | None, now: NodeMemory, *, change_bytes: int) -> bool:
    """Whether `now` says something `before` did not: other devices, or a device's used, free
    or foreign memory moved by `change_bytes` or more."""
    if before is None:
        return True
    old = {device.key: device for device in before.devices}
    if set(old) != {device.key for device in now.devices}:
        return True
    for device in now.devices:
        was = old[device.key]
        pairs = (
            (was.used_bytes, device.used_bytes),
            (was.free_bytes, device.free_bytes),
            (foreign_bytes(was), foreign_bytes(device)),
        )
        if any(abs(a - b) >= change_bytes for a, b in pairs):
            return True
    return False


def report_from_annotation(text: str, *, node: str) -> NodeMemory:
    """Read a report back; `node` is the Node it was on (keys name it, not the document)."""
    try:
        document = json.loads(text)
    except ValueError as err:
        raise ReportError(f"not JSON ({err})") from None
    if not isinstance(document, Mapping):
        raise ReportError("not a JSON object")
    if document.get("version") != VERSION:
        raise ReportError(f"version {document.get('version')!r}; this control plane reads 1")
    try:
        at = datetime.fromisoformat(str(document["at"]))
    except (KeyError, ValueError):
        raise ReportError(f"`at` {document.get('at')!r} is not an ISO 8601 time") from None
    if at.tzinfo is None:
        raise ReportError(f"`at` {document['at']!r} has no time zone")
    entries = document.get("devices")
    if not isinstance(entries, list):
        raise ReportError("`devices` is not a list")
    return NodeMemory(
        at=at,
        interval_s=_seconds(document, "interval_s"),
        heartbeat_s=_seconds(document, "heartbeat_s"),
        devices=tuple(_device(entry, node, number) for number, entry in enumerate(entries)),
    )


def _seconds(document: Mapping[str, Any], name: str) -> float:
    value = document.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ReportError(f"`{name}` {value!r} is not a positive number of seconds")
    return float(value)


def _device(entry: object, node: str, number: int) -> DeviceUsage:
    where = f"devices[{number}]"
    if not isinstance(entry, Mapping):
        raise ReportError(f"{where} is not an object")
    sizes: dict[str, int] = {}
    for name in _SIZES:
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ReportError(f"{where}.{name} {value!r} is not a byte count")
        sizes[name] = value
    indices: list[int | None] = []
    for name in ("gpu_index", "partition_index"):
        value = entry.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ReportError(f"{where}.{name} {value!r} is not a device index")
        indices.append(value)
    return DeviceUsage(
        node=node,
        gpu_index=indices[0],
        partition_index=indices[1],
        total_bytes=sizes["total_bytes"],
        used_bytes=sizes["used_bytes"],
        free_bytes=sizes["free_bytes"],
        # The agent's foreign figure is the fact; what cohabit uses is the rest of used.
        cohabit_bytes=max(0, sizes["used_bytes"] - sizes["foreign_bytes"]),
    )
