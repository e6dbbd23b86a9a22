"""One row per slot, as the test tables spell expectations: where, classes and sizes."""

from __future__ import annotations

from cohabit.hardware.model import Fleet, Node, Topology
from cohabit.hardware.slots import slots_of

Row = tuple[str, str, str, int, int]


def slot_rows(node: Node, *, topology: Topology = Topology.STANDALONE_CLUSTER) -> list[Row]:
    """(location, hardware_class, sharing_class, total_bytes, capacity_bytes) per slot."""
    fleet = Fleet(topology=topology, nodes=(node,))
    return [
        (s.location, s.hardware_class.value, s.sharing_class, s.total_bytes, s.capacity_bytes)
        for s in slots_of(fleet)
    ]
