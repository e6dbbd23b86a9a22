"""The node agent's meter, writing its report to kmock's emulated API server (real HTTP on
127.0.0.1, the real official client; emulator.py):

- on NVIDIA with MIG, from NVML's recorded per-process answers read through the real pynvml
  (tests/hardware/test_usage.py explains the recording): the processes of cohabit's engine
  pod count as cohabit's, another pod's as foreign; which pod each process is in comes from
  /proc/<pid>/cgroup files recorded on real nodes (tests/fixtures/kube/proc_cgroup.json),
  since no kubelet runs here;
- on this machine's CPU pool, with real processes whose cgroup files are recorded pods':
  the engine pod's resident memory is cohabit's, the other pod's is not;
- the report is written when it moved and on the heartbeat, not on every sample, and pods
  are listed only for a pod UID not seen before.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import psutil
import pytest

from cohabit.hardware.host import discover_host
from cohabit.hardware.usage import DeviceUsage
from cohabit.kube.cluster import NodePort
from cohabit.kube.nodememory import ANNOTATION_MEMORY, NodeMemory, moved, report_from_annotation
from cohabit.kube.nodemeter import NodeMeter
from cohabit.kube.podcgroup import pod_uid_in, pod_uid_of
from cohabit.kube.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, MANAGED_BY
from cohabit.units import GIB, MIB
from tests.hardware.test_usage import recorded_nvml
from tests.kube.emulator import NODES, PODS, Emulator
from tests.kube.test_podcgroup import RECORDED
from tests.service.test_meter import hold_memory
from tests.service.test_meter_gpu import H100_MIG

ENGINE_CGROUP = next(r for r in RECORDED if r["name"].startswith("v2 systemd driver, containerd"))
OTHER_CGROUP = next(r for r in RECORDED if r["name"].startswith("v2 cgroupfs driver"))
ENGINE, ENGINE_CHILD, OTHER = 4242, 4243, 48213  # the recording's pids


def put_node(emulator: Emulator, name: str) -> None:
    emulator.put(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def put_pod(emulator: Emulator, *, node: str, uid: str, name: str, engine: bool) -> None:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_DEPLOYMENT: name} if engine else {}
    emulator.put(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
        },
    )


def written(emulator: Emulator, node: str) -> NodeMemory:
    body = emulator.get(NODES, node) or {}
    text = ((body.get("metadata") or {}).get("annotations") or {})[ANNOTATION_MEMORY]
    return report_from_annotation(text, node=node)


def count(emulator: Emulator, method: str, path: str) -> int:
    return sum(1 for m, p in emulator.requests() if m == method and p == path)


def test_gpu_memory_of_an_engine_pod_is_cohabits_and_another_pods_is_foreign(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_nvml(monkeypatch, {"ENGINE": ENGINE, "ENGINE_CHILD": ENGINE_CHILD})
    node = H100_MIG.nodes[0]
    put_node(emulator, node.name)
    put_pod(emulator, node=node.name, uid=ENGINE_CGROUP["uid"], name="md-engine", engine=True)
    put_pod(emulator, node=node.name, uid=OTHER_CGROUP["uid"], name="notebook", engine=False)
    cgroups = {
        ENGINE: ENGINE_CGROUP["text"],
        ENGINE_CHILD: ENGINE_CGROUP["text"],
        OTHER: OTHER_CGROUP["text"],
    }
    meter = NodeMeter(
        node=node,
        api=NodePort(emulator.api()),
        interval_s=5,
        heartbeat_s=30,
        pod_of=lambda pid: pod_uid_in(cgroups.get(pid, "")),
        pids=lambda: pytest.fail("no pool here: the host's processes are not read"),
    )

    assert meter.tick() is True

    report = written(emulator, node.name)
    assert (report.interval_s, report.heartbeat_s) == (5.0, 30.0)
    assert abs((datetime.now(UTC) - report.at).total_seconds()) < 30
    by_key = {d.key: d for d in report.devices}
    assert set(by_key) == {("node-a", 0, 0), ("node-a", 0, 1), ("node-a", 1, None)}
    mig = by_key[("node-a", 0, 0)]  # the engine (14 GiB) and its child (2 GiB), both its pod's
    assert (mig.total_bytes, mig.used_bytes, mig.free_bytes) == (
        42144366592,
        17716396032,
        24427970560,
    )
    assert mig.cohabit_bytes == 16 * GIB
    small = by_key[("node-a", 0, 1)]  # the notebook's pod: not an engine pod
    assert (small.used_bytes, small.cohabit_bytes) == (5098176512, 0)
    card = by_key[("node-a", 1, None)]  # NVML cannot say what the engine holds: none counted
    assert (card.used_bytes, card.cohabit_bytes) == (18013323264, 0)
    text = (emulator.get(NODES, node.name) or {})["metadata"]["annotations"][ANNOTATION_MEMORY]
    entry = json.loads(text)["devices"][0]
    assert entry["foreign_bytes"] == 17716396032 - 16 * GIB

    # Nothing moved: not written again before the heartbeat, and the pods are known.
    patches = count(emulator, "PATCH", f"/api/v1/nodes/{node.name}")
    assert meter.tick() is False
    assert count(emulator, "PATCH", f"/api/v1/nodes/{node.name}") == patches == 1
    assert count(emulator, "GET", "/api/v1/pods") == 1
    meter.heartbeat_s = 0.2
    time.sleep(0.25)
    assert meter.tick() is True
    assert count(emulator, "PATCH", f"/api/v1/nodes/{node.name}") == 2


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


def test_on_a_cpu_pool_engine_pods_count_by_resident_memory_and_others_are_foreign(
    emulator: Emulator,
) -> None:
    """Two real processes stand for two pods' (their cgroup files recorded ones): the engine
    pod's 512 MiB are cohabit's, the other pod's 256 MiB are not. Only per-process figures
    are compared: the host's totals move with whatever else runs beside the test."""
    node = discover_host(name="cpu-node")
    put_node(emulator, node.name)
    put_pod(emulator, node=node.name, uid=ENGINE_CGROUP["uid"], name="md-engine", engine=True)
    put_pod(emulator, node=node.name, uid=OTHER_CGROUP["uid"], name="notebook", engine=False)
    engine, other = hold_memory(512 * MIB), hold_memory(256 * MIB)
    recorded = {engine.pid: ENGINE_CGROUP["text"], other.pid: OTHER_CGROUP["text"]}
    try:
        meter = NodeMeter(
            node=node,
            api=NodePort(emulator.api()),
            # Every other process's cgroup is read from this machine's /proc.
            pod_of=lambda pid: pod_uid_in(recorded[pid]) if pid in recorded else pod_uid_of(pid),
        )
        assert meter.tick() is True
        (pool,) = written(emulator, node.name).devices
        rss = psutil.Process(engine.pid).memory_info().rss
        assert pool.key == (node.name, None, None)
        assert pool.cohabit_bytes is not None and pool.cohabit_bytes >= 512 * MIB
        # The engine's own resident memory, not the other pod's beside it.
        assert abs(pool.cohabit_bytes - rss) < 128 * MIB
        text = (emulator.get(NODES, node.name) or {})["metadata"]["annotations"][ANNOTATION_MEMORY]
        (entry,) = json.loads(text)["devices"]
        assert entry["foreign_bytes"] == entry["used_bytes"] - entry["cohabit_bytes"]
        assert entry["used_bytes"] + entry["free_bytes"] <= entry["total_bytes"]
    finally:
        for process in (engine, other):
            process.kill()
            process.communicate()
