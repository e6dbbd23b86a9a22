"""How the control plane reads node agents' memory reports, without an API server: a MIG
slice's figures stay out (the cluster view names slots from the vendor's labels), and a
report of another version is refused by name (pure; `fleetview`). The reports written to
the real API server and planned with by `cohabit serve --backend kubernetes` and the
operator are tests/cluster/test_memory_report.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from cohabit.hardware.usage import DeviceUsage
from cohabit.kube.fleetview import node_measurements
from cohabit.kube.nodememory import ANNOTATION_MEMORY, NodeMemory
from cohabit.units import GIB


def test_a_reports_slices_stay_out_and_other_versions_are_refused_by_name() -> None:
    """A MIG slice's indices need not name the same slot in the cluster view (built from the
    vendor's labels); a document of another version is not guessed at."""
    now = datetime.now(UTC)

    def on(*devices: DeviceUsage, version: int = 1) -> dict[str, Any]:
        document = json.loads(
            NodeMemory(at=now, interval_s=5, heartbeat_s=30, devices=devices).to_annotation()
        )
        document["version"] = version
        return {
            "metadata": {"name": "node-a", "annotations": {ANNOTATION_MEMORY: json.dumps(document)}}
        }

    def gpu(index: int, partition: int | None) -> DeviceUsage:
        return DeviceUsage(
            node="elsewhere", gpu_index=index, partition_index=partition, total_bytes=40 * GIB,
            used_bytes=GIB, free_bytes=39 * GIB, cohabit_bytes=0,
        )  # fmt: skip

    devices, problems = node_measurements([on(gpu(0, 0), gpu(0, 1), gpu(1, None))], now=now)
    assert [d.key for d in devices] == [("node-a", 1, None)]  # named by the Node, not the text
    assert problems == {}
    devices, problems = node_measurements([on(gpu(1, None), version=2)], now=now)
    assert devices == []
    assert problems == {
        "node-a": f"its {ANNOTATION_MEMORY} annotation is unreadable: version 2; this control "
        "plane reads 1"
    }
