"""The meter: a thread that samples, every few seconds, the memory each engine really uses on
its device and the memory each device has in use and free, and keeps a short history.

Engines are attributed by process tree: an engine's pid (from its deployment's handle) and
all its children. On a GPU the driver's per-process figures of those pids are summed; on a
CPU or unified-memory pool their resident memory. What a device has in use beyond that is
held outside cohabit ("foreign"); placement then never counts on it (`measurement()`, which
the reconciler hands to the ledger). On Kubernetes `measure` reads the node agents' reports,
whose devices say what cohabit's engine pods use (`DeviceUsage.cohabit_bytes`). The last
sample is stored with each deployment, and an engine above its budget (plus the tolerance) is
reported once per episode and handled by its deployment's `over_budget` policy
(`overbudget.py`).

Read API (the web page, `/metrics`, `/api/cluster/memory`): `latest()` → `MeterSnapshot`,
`history(deployment_id)`, `device_history(slot_key)`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import psutil

from cohabit.hardware.host import host_name
from cohabit.hardware.model import Fleet
from cohabit.hardware.slots import SlotKey
from cohabit.hardware.usage import DeviceUsage, measure_node
from cohabit.placement.state import FleetState, Measurement
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.process import process_facts
from cohabit.service.periodic import Periodic
from cohabit.store import deployments, ledger
from cohabit.store.database import Database, utcnow
from cohabit.store.memory import MemorySample, save_samples
from cohabit.store.records import HOLDING, DeploymentRecord

log = logging.getLogger(__name__)

HISTORY_POINTS = 120  # ten minutes at the default pace: enough for a sparkline
STALE_PASSES = 3  # a measurement older than this many intervals is not used for placement

Measure = Callable[[Fleet], Sequence[DeviceUsage]]


def measure_here(fleet: Fleet) -> Sequence[DeviceUsage]:
    """Measure the fleet's node that is this machine (by host name); others are not ours to
    read, and a simulated fleet (a fleet file) has none."""
    here = host_name()
    return [usage for node in fleet.nodes if node.name == here for usage in measure_node(node)]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceReading:
    """One slot's device at the last sample. `cohabit_bytes` is what cohabit's engines use
    there and `foreign_bytes` the rest of `used_bytes`; `reserved_bytes` the budgets held."""

    node: str
    gpu_index: int | None
    partition_index: int | None
    location: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    cohabit_bytes: int
    foreign_bytes: int
    capacity_bytes: int
    reserved_bytes: int

    @property
    def key(self) -> SlotKey:
        return (self.node, self.gpu_index, self.partition_index)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineReading:
    """One deployment's engine at the last sample: bytes used (summed over its devices; None
    where the driver could not say) against its budget (summed likewise)."""

    deployment_id: str
    used_bytes: int | None
    budget_bytes: int
    at: datetime
    over_budget: bool
    over_budget_since: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryPoint:
    at: datetime
    used_bytes: int | None
    budget_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MeterSnapshot:
    """The last sample; `at` is None before the first one."""

    at: datetime | None = None
    devices: tuple[DeviceReading, ...] = ()
    deployments: Mapping[str, EngineReading] = field(default_factory=dict)


OverBudgetHandler = Callable[[DeploymentRecord, EngineReading], None]


class Meter:
    """Samples every `interval_s` on its own thread (`start`/`stop`); `sample()` is one pass
    (tests call it). `tolerance_fraction`: how far above its budget an engine may go before
    it counts as over; `headroom_bytes`: kept free beside measured memory (`Measurement`)."""

    def __init__(
        self,
        db: Database,
        *,
        measure: Measure = measure_here,
        interval_s: float = 5.0,
        headroom_bytes: int = 0,
        tolerance_fraction: float = 0.1,
        on_over_budget: OverBudgetHandler | None = None,
    ) -> None:
        self.db = db
        self.measure = measure
        self.interval_s = interval_s
        self.headroom_bytes = headroom_bytes
        self.tolerance_fraction = tolerance_fraction
        self.on_over_budget = on_over_budget
        self._latest = MeterSnapshot()
        self._measurement: Measurement | None = None
        self._measured_at: float | None = None
        self._history: dict[str, deque[HistoryPoint]] = {}
        self._device_history: dict[SlotKey, deque[DeviceReading]] = {}
        self._lock = threading.Lock()
        self._periodic = Periodic("cohabit-meter", self.sample, interval_s=interval_s)

    # --- read API -------------------------------------------------------------------------

    def latest(self) -> MeterSnapshot:
        return self._latest

    def history(self, deployment_id: str) -> tuple[HistoryPoint, ...]:
        """The deployment's last samples, oldest first."""
        with self._lock:
            return tuple(self._history.get(deployment_id, ()))

    def device_history(self, key: SlotKey) -> tuple[DeviceReading, ...]:
        with self._lock:
            return tuple(self._device_history.get(key, ()))

    def measurement(self) -> Measurement | None:
        """What placement should count on, or None when there is no recent sample."""
        taken = self._measured_at
        if taken is None or time.monotonic() - taken > STALE_PASSES * max(self.interval_s, 1.0):
            return None
        return self._measurement

    # --- the thread -----------------------------------------------------------------------

    def start(self) -> None:
        if self.interval_s > 0:
            self._periodic.start()

    def stop(self, *, timeout_s: float = 10.0) -> None:
        self._periodic.stop(timeout_s=timeout_s)

    # --- one pass -------------------------------------------------------------------------

    def sample(self) -> MeterSnapshot:
        """Measure, attribute, store, and act on engines over their budget."""
        state = ledger.current_state(self.db)
        devices = {usage.key: usage for usage in self.measure(state.fleet)}
        records = [r for r in deployments.list_active(self.db) if r.status in HOLDING]
        held: dict[str, dict[SlotKey, int]] = {}
        for reservation in state.reservations:
            slots = held.setdefault(reservation.deployment, {})
            slots[reservation.slot_key] = slots.get(reservation.slot_key, 0) + (
                reservation.reserved_bytes
            )
        now = utcnow()
        cohabit: dict[SlotKey, int] = {}
        readings: dict[str, EngineReading] = {}
        over: list[tuple[DeploymentRecord, EngineReading]] = []
        for record in records:
            budgets = held.get(record.id, {})
            used = _engine_use(record, budgets, devices)
            if used is None:
                continue
            known = [b for b in used.values() if b is not None]
            for key, used_bytes in used.items():
                cohabit[key] = cohabit.get(key, 0) + (used_bytes or 0)
            # A sleeping engine is held to its residue in the ledger, but what vLLM keeps
            # asleep is its own business until it wakes: the devices' measured free memory
            # already bounds placement beside it, so it is never called over its budget.
            is_over = record.sleep_level is None and any(
                b is not None and b > budgets[key] * (1 + self.tolerance_fraction)
                for key, b in used.items()
            )
            since = (record.over_budget_since or now) if is_over else None
            reading = EngineReading(
                deployment_id=record.id,
                used_bytes=sum(known) if known else None,
                budget_bytes=sum(budgets.values()),
                at=now,
                over_budget=is_over,
                over_budget_since=since,
            )
            readings[record.id] = reading
            if is_over and record.over_budget_since is None:
                over.append((record, reading))
        for key, usage in devices.items():
            if usage.cohabit_bytes is not None:  # attributed where it was measured
                cohabit[key] = cohabit.get(key, 0) + usage.cohabit_bytes
        measurement = Measurement.of(devices.values(), cohabit, headroom_bytes=self.headroom_bytes)
        snapshot = MeterSnapshot(
            at=now,
            devices=_device_readings(state, devices.values(), measurement),
            deployments=readings,
        )
        self._remember(snapshot)
        self._measurement, self._measured_at = measurement, time.monotonic()
        self._latest = snapshot
        save_samples(
            self.db,
            {
                r.deployment_id: MemorySample(
                    used_bytes=r.used_bytes,
                    at=r.at,
                    over_budget_since=r.over_budget_since,
                )
                for r in readings.values()
                if r.used_bytes is not None
            },
        )
        for record, reading in over:
            if self.on_over_budget is not None:
                try:
                    self.on_over_budget(record, reading)
                except Exception:  # one deployment's policy must not stop the others'
                    log.exception("handling deployment %s over its budget failed", record.id)
        return snapshot

    def _remember(self, snapshot: MeterSnapshot) -> None:
        with self._lock:
            for deployment_id, reading in snapshot.deployments.items():
                points = self._history.setdefault(deployment_id, deque(maxlen=HISTORY_POINTS))
                points.append(
                    HistoryPoint(
                        at=reading.at,
                        used_bytes=reading.used_bytes,
                        budget_bytes=reading.budget_bytes,
                    )
                )
            for gone in set(self._history) - set(snapshot.deployments):
                del self._history[gone]
            for device in snapshot.devices:
                kept = self._device_history.setdefault(device.key, deque(maxlen=HISTORY_POINTS))
                kept.append(device)


def _engine_use(
    record: DeploymentRecord, budgets: Mapping[SlotKey, int], devices: Mapping[SlotKey, DeviceUsage]
) -> dict[SlotKey, int | None] | None:
    """Bytes the deployment's engine uses on each device it holds; None when it has no local
    process or none of its devices was measured."""
    handle = handle_from_json(record.engine_handle)
    if handle is None or handle.pid is None or not any(k in devices for k in budgets):
        return None
    tree = _process_tree(handle.pid)
    if not tree:
        return None
    used: dict[SlotKey, int | None] = {}
    for key in budgets:
        device = devices.get(key)
        if device is None:
            continue
        if key[1] is None:  # a memory pool: the tree's resident memory
            facts = process_facts(handle.pid)
            used[key] = None if facts is None else facts.rss_bytes
        else:
            figures = [p.used_bytes for p in device.processes if p.pid in tree]
            used[key] = None if any(f is None for f in figures) else sum(f or 0 for f in figures)
    return used


def _process_tree(pid: int) -> frozenset[int]:
    """`pid` and all its descendants; empty once it is gone."""
    try:
        root = psutil.Process(pid)
        return frozenset([pid, *(child.pid for child in root.children(recursive=True))])
    except psutil.Error:
        return frozenset()


def _device_readings(
    state: FleetState, devices: Iterable[DeviceUsage], measurement: Measurement
) -> tuple[DeviceReading, ...]:
    by_key = {slot.key: slot for slot in state.slots}
    reserved = state.used_bytes()
    readings: list[DeviceReading] = []
    for device in devices:
        slot = by_key.get(device.key)
        measured = measurement.slots[device.key]
        readings.append(
            DeviceReading(
                node=device.node,
                gpu_index=device.gpu_index,
                partition_index=device.partition_index,
                location=slot.location if slot is not None else _location(device),
                total_bytes=device.total_bytes,
                used_bytes=device.used_bytes,
                free_bytes=device.free_bytes,
                cohabit_bytes=measured.cohabit_bytes,
                foreign_bytes=measured.foreign_bytes,
                capacity_bytes=slot.capacity_bytes if slot is not None else device.total_bytes,
                reserved_bytes=reserved.get(device.key, 0),
            )
        )
    return tuple(readings)


def _location(device: DeviceUsage) -> str:
    if device.gpu_index is None:
        return f"{device.node} pool"
    text = f"{device.node} gpu {device.gpu_index}"
    return text if device.partition_index is None else f"{text} #{device.partition_index}"
