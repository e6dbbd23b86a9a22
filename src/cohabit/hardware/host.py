"""The host itself: system memory, name and OS — the CPU pool of a machine with no GPU.

`discover.py` falls back to `discover_host()`; the NVIDIA and AMD adapters read
`read_host_memory()` to size unified-memory pools (GB10, Strix Halo).
"""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass
from pathlib import Path

from cohabit.hardware.model import Node
from cohabit.units import KIB

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMemory:
    """System memory in bytes: `total_bytes` installed (as the OS sees it), `available_bytes`
    what new processes can get without swapping (Linux MemAvailable), None when unknown."""

    total_bytes: int
    available_bytes: int | None = None


def parse_meminfo(text: str) -> HostMemory | None:
    """Read `/proc/meminfo` text (values in kB, which the kernel means as KiB).

    >>> parse_meminfo("MemTotal:       16384 kB\\nMemAvailable:    8192 kB\\n")
    HostMemory(total_bytes=16777216, available_bytes=8388608)
    """
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            factor = KIB if len(parts) > 1 and parts[1].lower() == "kb" else 1
            values[key.strip()] = int(parts[0]) * factor
    if "MemTotal" not in values:
        return None
    return HostMemory(total_bytes=values["MemTotal"], available_bytes=values.get("MemAvailable"))


def read_host_memory(meminfo_text: str | None = None) -> HostMemory:
    """This machine's memory: from `meminfo_text` (tests), `/proc/meminfo`, or psutil."""
    if meminfo_text is None and MEMINFO.exists():
        meminfo_text = MEMINFO.read_text(encoding="ascii", errors="replace")
    if meminfo_text is not None:
        parsed = parse_meminfo(meminfo_text)
        if parsed is not None:
            return parsed
    import psutil  # only off Linux: macOS, Windows

    memory = psutil.virtual_memory()
    return HostMemory(total_bytes=int(memory.total), available_bytes=int(memory.available))


def host_name() -> str:
    """The name this node goes by: the short host name."""
    return socket.gethostname().split(".")[0] or "localhost"


def host_os() -> str:
    """``linux``, ``macos`` or ``windows``, as `Node.os` spells them."""
    system = platform.system().lower()
    return "macos" if system == "darwin" else system or "linux"


def discover_host(*, memory: HostMemory | None = None, name: str | None = None) -> Node:
    """The machine as a CPU pool: system memory minus the OS reserve (docs/hardware.md `cpu`)."""
    memory = memory or read_host_memory()
    return Node(
        name=name or host_name(),
        os=host_os(),
        memory_bytes=memory.total_bytes,
        free_memory_bytes=memory.available_bytes,
    )
