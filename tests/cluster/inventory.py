"""The hardware the cluster tests' node agents are given, since no GPU is here: a Node
discovered from recorded NVML answers (tests/fixtures/hardware, replayed by
tests/hardware/fakes.py through pynvml's function names), and the fleet file
`cohabit gpus --export` writes for it, which the agent reads with `--fleet`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cohabit.hardware.fleetfile import dump_fleet
from cohabit.hardware.model import Fleet, Node, Topology
from cohabit.hardware.nvidia import discover_nvidia
from tests.hardware import fakes

T4X4 = "nvml_t4x4.json"  # four 16 GB T4s: 15360 MiB each, a 15 GiB budget each


def recording(name: str = T4X4, *, cards: int | None = None) -> dict[str, Any]:
    """A recorded NVML snapshot; with `cards`, only its first `cards` devices (the same
    machine with fewer cards in it)."""
    snapshot = fakes.load(name)
    if cards is not None:
        snapshot = {**snapshot, "devices": snapshot["devices"][:cards]}
    return snapshot


def discovered(node_name: str, snapshot: dict[str, Any]) -> Node:
    """What the agent's discovery makes of the recorded answers, named after the node."""
    node = discover_nvidia(fakes.FakeNvml(snapshot), name=node_name, host=fakes.host_of(snapshot))
    assert node is not None, "the recording has no NVIDIA GPU"
    return node


def fleet_file(folder: Path, node: Node) -> Path:
    """`node` exported as `cohabit gpus --export` writes it (a one-node standalone fleet)."""
    path = folder / f"{node.name}-fleet.yaml"
    path.write_text(dump_fleet(Fleet(topology=Topology.STANDALONE_CLUSTER, nodes=(node,))))
    return path
