"""When the node agent's memory report counts as moved: a figure by the threshold or more, or
other devices (pure; `nodememory.moved`). The meter writing to the real API server, from
recorded NVML answers and real processes, is tests/cluster/test_memory_report.py."""

from __future__ import annotations

from datetime import UTC, datetime

from cohabit.hardware.usage import DeviceUsage
from cohabit.kube.nodememory import NodeMemory, moved
from cohabit.units import GIB, MIB


def device(used: int, cohabit: int, free: int) -> DeviceUsage:
    return DeviceUsage(
        node="n",
        gpu_index=0,
        partition_index=None,
        total_bytes=16 * GIB,
        used_bytes=used,
        free_bytes=free,
        cohabit_bytes=cohabit,
    )


def report_of(*devices: DeviceUsage) -> NodeMemory:
    return NodeMemory(at=datetime.now(UTC), interval_s=5, heartbeat_s=30, devices=devices)


def test_a_report_moves_when_a_figure_moves_by_the_threshold_or_the_devices_change() -> None:
    before = report_of(device(4 * GIB, 2 * GIB, 12 * GIB))
    step = 256 * MIB
    assert not moved(
        before, report_of(device(4 * GIB + step - 1, 2 * GIB, 12 * GIB)), change_bytes=step
    )
    # The same used memory, but an engine gave back what someone else now holds.
    assert moved(before, report_of(device(4 * GIB, 2 * GIB - step, 12 * GIB)), change_bytes=step)
    assert moved(before, report_of(device(4 * GIB, 2 * GIB, 12 * GIB - step)), change_bytes=step)
    assert moved(before, report_of(), change_bytes=step)
    assert moved(None, before, change_bytes=step)
