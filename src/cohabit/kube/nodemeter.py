"""The node agent's meter: every few seconds it measures this node's devices with the same
readers as the server's meter (`hardware.usage.measure_node`: NVML, amdsmi, host memory),
attributes the processes on them to cohabit's engine pods, and writes the result as the
node's `cohabit.dev/memory` annotation (`nodememory.py`) — when a figure moved by
`change_bytes` or more, or when `heartbeat_s` has passed since the last write, so an idle node
costs the API server one small PATCH per heartbeat.

Attribution: a process belongs to the pod its cgroup names (`podcgroup.py`); the pod is an
engine pod when it carries our engine labels (`resources.py`: app.kubernetes.io/managed-by
cohabit and cohabit.dev/model-deployment). On a GPU the driver's per-process bytes of those
processes are summed; on a pool their resident memory. Pods are listed (this node only)
only when a process names a pod UID not seen before: UIDs are never reused, so a pod's answer
is kept while its processes live. Seeing other pods' processes needs the host's PID namespace
(the chart's `hostPID`), where NVML's pids are too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import psutil

from cohabit.hardware.model import Node
from cohabit.hardware.usage import DeviceUsage, measure_node
from cohabit.kube.errors import ClusterError
from cohabit.kube.nodememory import ANNOTATION_MEMORY, NodeMemory, moved
from cohabit.kube.podcgroup import pod_uid_of
from cohabit.kube.resources import LABEL_DEPLOYMENT, LABEL_MANAGED_BY, MANAGED_BY
from cohabit.units import MIB

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0  # as the server's meter
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_CHANGE_BYTES = 256 * MIB


class LabelsApi(Protocol):
    """Setting a Node's labels and annotations (`cluster.NodePort`); None removes one."""

    def patch_labels(
        self,
        name: str,
        labels: Mapping[str, str | None],
        annotations: Mapping[str, str | None] | None = None,
    ) -> None: ...


class MeterApi(LabelsApi, Protocol):
    """The calls the agent's meter makes (`cluster.NodePort`)."""

    def list_pods_on(self, node: str) -> list[dict[str, Any]]: ...


def is_engine_pod(pod: Mapping[str, Any]) -> bool:
    """A pod the operator made to run a ModelDeployment's engine."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_MANAGED_BY) == MANAGED_BY and bool(labels.get(LABEL_DEPLOYMENT))


def resident_bytes(pid: int) -> int | None:
    """One process's resident memory (not its children's: each is counted on its own)."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


class NodeMeter:
    """Samples `node` (this machine) and keeps its annotation current; `tick()` is one pass
    (tests call it), `run()` the loop. The seams (`measure`, `pod_of`, `pids`, `rss`,
    `clock` for the report's time, `monotonic_s` for the heartbeat) default to the real
    readers."""

    def __init__(
        self,
        *,
        node: Node,
        api: MeterApi,
        interval_s: float = DEFAULT_INTERVAL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        change_bytes: int = DEFAULT_CHANGE_BYTES,
        measure: Callable[[Node], Sequence[DeviceUsage]] = measure_node,
        pod_of: Callable[[int], str | None] = pod_uid_of,
        pids: Callable[[], Sequence[int]] = psutil.pids,
        rss: Callable[[int], int | None] = resident_bytes,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.api = api
        self.interval_s = interval_s
        self.heartbeat_s = heartbeat_s
        self.change_bytes = change_bytes
        self.measure = measure
        self.pod_of = pod_of
        self.pids = pids
        self.rss = rss
        self.clock = clock
        self.monotonic_s = monotonic_s
        self._engine_pods: dict[str, bool] = {}  # pod UID → an engine pod of ours
        self._written: NodeMemory | None = None
        self._written_at: float | None = None

    def sample(self) -> NodeMemory:
        """Measure the node's devices and attribute what cohabit's engine pods use."""
        at = self.clock()
        devices = list(self.measure(self.node))
        pools = any(device.gpu_index is None for device in devices)
        owners = self._owners(devices, pools)
        engines = {pid for pid, uid in owners.items() if self._engine_pods.get(uid)}
        pool_bytes = sum(self.rss(pid) or 0 for pid in engines) if pools else 0
        attributed = []
        for device in devices:
            if device.gpu_index is None:
                ours = pool_bytes
            else:  # a figure the driver cannot give counts as nothing, as locally
                ours = sum(p.used_bytes or 0 for p in device.processes if p.pid in engines)
            attributed.append(replace(device, cohabit_bytes=ours))
        return NodeMemory(
            at=at,
            interval_s=self.interval_s,
            heartbeat_s=self.heartbeat_s,
            devices=tuple(attributed),
        )

    def _owners(self, devices: Sequence[DeviceUsage], pools: bool) -> dict[int, str]:
        """Pod UID per process that is in a pod: every process of the host where a pool is
        measured, else those the drivers list. Learns unknown UIDs by listing this node's
        pods."""
        candidates = set(self.pids()) if pools else set()
        for device in devices:
            candidates.update(process.pid for process in device.processes)
        owners = {}
        for pid in candidates:
            uid = self.pod_of(pid)
            if uid is not None:
                owners[pid] = uid
        unknown = set(owners.values()) - set(self._engine_pods)
        if unknown:
            pods = self.api.list_pods_on(self.node.name)
            listed = {
                str((pod.get("metadata") or {}).get("uid")): is_engine_pod(pod) for pod in pods
            }
            # A UID the list lacks is a pod already deleted: not one of ours from now on.
            self._engine_pods.update({uid: listed.get(uid, False) for uid in unknown})
        live = set(owners.values())
        self._engine_pods = {u: e for u, e in self._engine_pods.items() if u in live}
        return owners

    def tick(self) -> bool:
        """One sample; write it when it moved or the heartbeat is due. True when written."""
        report = self.sample()
        now_s = self.monotonic_s()
        due = self._written_at is None or now_s - self._written_at >= self.heartbeat_s
        if not due and not moved(self._written, report, change_bytes=self.change_bytes):
            return False
        self.api.patch_labels(self.node.name, {}, {ANNOTATION_MEMORY: report.to_annotation()})
        self._written, self._written_at = report, now_s
        return True

    def run(self, stop: threading.Event) -> None:
        """Tick every `interval_s` until `stop`; a failed pass is logged and tried again."""
        while not stop.is_set():
            try:
                self.tick()
            except (ClusterError, OSError) as err:
                log.warning("memory report for %s not written: %s", self.node.name, err)
            except Exception:  # a driver error must not end the agent's budgets
                log.exception("measuring %s failed; trying again", self.node.name)
            stop.wait(self.interval_s)
