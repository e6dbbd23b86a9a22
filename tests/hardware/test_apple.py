"""Apple-silicon adapter: `sysctl -n` answers and Metal's working set replayed through
`FakeSysctl`, passed as the adapter's `sysctl` and `metal_working_set` seams."""

from __future__ import annotations

import pytest

from cohabit.hardware.apple import discover_apple
from cohabit.units import GIB
from tests.hardware import fakes
from tests.hardware.slotrows import slot_rows


@pytest.mark.parametrize(
    ("working_set", "capacity"),
    [
        pytest.param(77309411328, 72 * GIB, id="metal-working-set-caps-the-pool"),
        pytest.param(None, 88 * GIB, id="no-metal-reading-total-minus-8GiB"),
        pytest.param(100 * GIB, 88 * GIB, id="working-set-above-total-minus-reserve"),
    ],
)
def test_m2max_pool_is_the_smaller_of_reserve_and_working_set(
    working_set: int | None, capacity: int
) -> None:
    """FakeSysctl replays sysctl_m2max.json (hw.memsize = 96 GiB) with the given Metal figure."""
    fake = fakes.sysctl("sysctl_m2max.json")
    node = discover_apple(fake, metal_working_set=lambda: working_set)
    assert node is not None
    assert slot_rows(node) == [
        ("studio unified pool", "unified_memory", "metal_spawner", 96 * GIB, capacity)
    ]
    assert (node.os, node.gpus[0].product) == ("macos", "Apple M2 Max")


def test_recorded_metal_figure() -> None:
    """FakeSysctl replays sysctl_m2max.json including its recorded Metal working set."""
    fake = fakes.sysctl("sysctl_m2max.json")
    node = discover_apple(fake, metal_working_set=fake.metal_working_set, name="m")
    assert node is not None
    assert node.os_reserve_bytes == 96 * GIB - 77309411328


def test_intel_mac_is_not_apple_silicon() -> None:
    """FakeSysctl replays sysctl_intel_mac.json: not ours; the CPU host adapter takes it."""
    fake = fakes.sysctl("sysctl_intel_mac.json")
    assert discover_apple(fake, metal_working_set=fake.metal_working_set) is None
