"""What this machine has: NVIDIA, then AMD, then Apple silicon, else the CPU host.

The one entry point for local discovery (`cohabit gpus`, `cohabit serve`, the node agent).
The first adapter that finds accelerators wins; a machine with none is a CPU pool.
"""

from __future__ import annotations

from typing import Any

from cohabit.hardware.amd import discover_amd
from cohabit.hardware.apple import Sysctl, discover_apple
from cohabit.hardware.host import HostMemory, discover_host, host_name, read_host_memory
from cohabit.hardware.model import Fleet, Node, Topology
from cohabit.hardware.nvidia import discover_nvidia


def discover_local_node(
    *,
    name: str | None = None,
    nvml: Any = None,
    amdsmi: Any = None,
    sysctl: Sysctl | None = None,
    host: HostMemory | None = None,
) -> Node:
    """This machine as a Node. The keyword seams replace the real libraries in tests.

    Raises:
        DiscoveryError: a GPU library is present but failed.
    """
    name = name or host_name()
    node = discover_nvidia(nvml, name=name, host=host)
    if node is None:
        node = discover_amd(amdsmi, name=name, host=host)
    if node is None:
        node = discover_apple(sysctl, name=name)
    if node is None:
        node = discover_host(memory=host or read_host_memory(), name=name)
    return node


def discover_local_fleet(**seams: Any) -> Fleet:
    """This machine as a one-node standalone fleet (what `cohabit gpus --export` writes)."""
    return Fleet(topology=Topology.STANDALONE_CLUSTER, nodes=(discover_local_node(**seams),))
