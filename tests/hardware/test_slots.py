"""`slots_of` keeps the last fleet's slots for a fleet of the very same node objects, and
never serves them for any other fleet."""

from __future__ import annotations

from dataclasses import replace

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.hardware.slots import slots_of
from cohabit.units import GIB


def _node(name: str, gib: int) -> Node:
    gpu = Gpu(index=0, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=gib * GIB)
    return Node(name=name, gpus=(gpu,))


def test_the_same_nodes_give_the_same_slots_and_any_change_is_listed_afresh() -> None:
    a, b = _node("a", 16), _node("b", 24)
    fleet = Fleet(nodes=(a, b))
    first = slots_of(fleet)
    assert slots_of(Fleet(nodes=(a, b))) is first  # another fleet of the same objects

    grown = replace(b, gpus=(replace(b.gpus[0], memory_bytes=48 * GIB),))
    changed = slots_of(Fleet(nodes=(a, grown)))
    assert [s.capacity_bytes for s in changed][1] == 48 * GIB

    reordered = slots_of(Fleet(nodes=(b, a)))
    assert [s.node for s in reordered] == ["b", "a"]
    assert slots_of(Fleet(nodes=(a, b), fractional=False)) is not first
    assert slots_of(Fleet(nodes=(a, b))) == first
