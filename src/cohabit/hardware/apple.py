"""Apple silicon discovery: chip name and unified memory from `sysctl`, capped by Metal's
recommended working set when it can be read → one `Node`. Called by `discover.py`.

Units at this edge: `hw.memsize` and `recommendedMaxWorkingSetSize` are bytes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from cohabit.hardware.model import DEFAULT_OS_RESERVE_BYTES, Gpu, Node, Vendor

Sysctl = Callable[[str], str | None]
"""Reads one sysctl key as text (`sysctl -n KEY`), None when the key does not exist."""


def discover_apple(
    sysctl: Sysctl | None = None,
    *,
    metal_working_set: Callable[[], int | None] | None = None,
    name: str | None = None,
) -> Node | None:
    """This Mac as a unified-memory Node, or None when it is not an Apple-silicon Mac.

    The pool is `hw.memsize`; placement may use the smaller of pool − 8 GiB and Metal's
    `recommendedMaxWorkingSetSize` (how much the GPU may keep resident), which is expressed
    as a larger OS reserve so that `slots.py` needs no Apple rule. Sharing class
    `metal_spawner` follows from `classify.pool_classes`.
    """
    if sysctl is None:
        if sys.platform != "darwin":
            return None
        sysctl = read_sysctl
    brand = sysctl("machdep.cpu.brand_string")
    if not brand or not brand.strip().startswith("Apple"):
        return None  # an Intel Mac: the CPU host adapter takes it
    memsize = sysctl("hw.memsize")
    if not memsize or not memsize.strip().isdigit():
        return None
    total_bytes = int(memsize)
    reserve = DEFAULT_OS_RESERVE_BYTES
    working_set = (metal_working_set or read_metal_working_set)()
    if working_set:
        reserve = max(reserve, total_bytes - working_set)
    return Node(
        name=name or _short_host(sysctl),
        os="macos",
        gpus=(Gpu(index=0, vendor=Vendor.APPLE, product=brand.strip()),),
        unified_memory_bytes=total_bytes,
        os_reserve_bytes=reserve,
    )


def read_sysctl(key: str) -> str | None:
    """`sysctl -n KEY` on this machine; None when the key or the command is missing."""
    try:
        result = subprocess.run(
            ["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None


def read_metal_working_set() -> int | None:
    """Metal's `recommendedMaxWorkingSetSize` via pyobjc when installed; None otherwise."""
    try:
        import Metal  # pyobjc-framework-Metal, optional
    except ImportError:
        return None
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        return None
    return int(device.recommendedMaxWorkingSetSize())


def _short_host(sysctl: Sysctl) -> str:
    hostname = sysctl("kern.hostname") or "localhost"
    return hostname.split(".")[0]
