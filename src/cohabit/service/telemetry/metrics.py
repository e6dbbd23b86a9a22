"""What `/metrics` exports, in Prometheus' text format. One `ServerMetrics` per app (its own
registry, so two servers in one test process never share a series), holding:

- `ReconcilerCounters`: what the reconciler counts where it happens (placement decisions,
  NoFits by reason, pass durations, engine starts and failures by code) — a few additions
  on its thread, under a lock;
- `StateCollector`: what is read at scrape time — devices (capacity, reserved, and used and
  foreign bytes from the meter when the server has one), active deployments (budget,
  status, copies, used bytes) and the gateway's traffic counters (`activity.Activity`),
  turned into families on each scrape so the request path never calls into
  prometheus_client.

Both keep plain numbers and build families when scraped, so there are no `_created` series.

Every figure is in bytes or seconds, as the names say. docs/metrics.md lists them.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from cohabit.hardware.slots import Slot, SlotKey
from cohabit.placement.decision import Placement
from cohabit.placement.reasons import NoFit, NoFitReason
from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.service.telemetry.activity import LATENCY_BUCKETS_S, Activity, Usage
from cohabit.store import copyset, deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord, DeploymentStatus

log = logging.getLogger(__name__)

# A pass is a few queries when nothing changes and a plan plus an engine start when one
# does; the buckets span both, up to a pass stuck on a slow database.
PASS_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A load's phases span a fork from a pre-imported launcher to a large model read from disk.
LOAD_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DEVICE_LABELS = ("node", "gpu", "partition", "kind")
DEPLOYMENT_LABELS = ("id", "model")


class ReconcilerCounters:
    """What the reconciler counts as it goes: plain additions under a lock, turned into
    families on each scrape (it is a collector). Every label value that can occur is shown
    from zero, so a rate over a series that has not happened yet reads 0, not nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decisions = dict.fromkeys(("placed", "no_fit"), 0)
        self._no_fits = dict.fromkeys((reason.value for reason in NoFitReason), 0)
        self._starts = 0
        self._failures = dict.fromkeys((code.value for code in RuntimeErrorCode), 0)
        self._passes = [0] * (len(PASS_BUCKETS_S) + 1)  # per bucket, as Usage.buckets
        self._pass_seconds = 0.0
        # (engine, phase) → per-bucket counts and summed seconds of loads' phases.
        self._loads: dict[tuple[str, str], tuple[list[int], float]] = {}

    def placement(self, decision: Placement | NoFit) -> None:
        with self._lock:
            if isinstance(decision, NoFit):
                self._decisions["no_fit"] += 1
                reason = decision.reason.value
                self._no_fits[reason] = self._no_fits.get(reason, 0) + 1
            else:
                self._decisions["placed"] += 1

    def pass_took(self, seconds: float) -> None:
        with self._lock:
            self._passes[bisect.bisect_left(PASS_BUCKETS_S, seconds)] += 1
            self._pass_seconds += seconds

    def engine_started(self) -> None:
        with self._lock:
            self._starts += 1

    def load_phases(self, engine: str, seconds: Mapping[str, float]) -> None:
        """Phases of one load (service/control/loadphases.py, PHASES), each observed once."""
        with self._lock:
            for phase, value in seconds.items():
                empty = ([0] * (len(LOAD_BUCKETS_S) + 1), 0.0)
                buckets, total = self._loads.get((engine, phase), empty)
                buckets[bisect.bisect_left(LOAD_BUCKETS_S, value)] += 1
                self._loads[(engine, phase)] = (buckets, total + value)

    def engine_failed(self, code: RuntimeErrorCode) -> None:
        with self._lock:
            self._failures[code.value] = self._failures.get(code.value, 0) + 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            decisions, no_fits = dict(self._decisions), dict(self._no_fits)
            starts, failures = self._starts, dict(self._failures)
            passes, pass_seconds = list(self._passes), self._pass_seconds
            loads = {key: (list(buckets), total) for key, (buckets, total) in self._loads.items()}
        yield _counter(
            "cohabit_placement_decisions",
            "Placement decisions, by outcome (placed, no_fit).",
            "outcome",
            decisions,
        )
        yield _counter(
            "cohabit_placement_no_fits",
            "Deployments refused for lack of room, by NoFit reason.",
            "reason",
            no_fits,
        )
        yield CounterMetricFamily("cohabit_engine_starts", "Engines the runtime started.", starts)
        yield _counter(
            "cohabit_engine_failures",
            "Engines that failed to start or died, by runtime error code.",
            "code",
            failures,
        )
        yield HistogramMetricFamily(
            "cohabit_reconciler_pass_duration_seconds",
            "Duration of the reconciler's passes.",
            buckets=_cumulative(PASS_BUCKETS_S, passes),
            sum_value=pass_seconds,
        )
        phases = HistogramMetricFamily(
            "cohabit_load_phase_seconds",
            "Where each load's time went, by engine and phase (placing: asked to placed; "
            "starting: placed to the engine's process; engine_load: process to answering, "
            "in engine_import, weights_load and engine_warmup when its log shows them; "
            "first_token: answering to the first answer to a request held for the load).",
            labels=("engine", "phase"),
        )
        for (engine, phase), (buckets, total) in sorted(loads.items()):
            phases.add_metric(
                [engine, phase], buckets=_cumulative(LOAD_BUCKETS_S, buckets), sum_value=total
            )
        yield phases


def _counter(name: str, text: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, text, labels=(label,))
    for value, count in counts.items():
        family.add_metric([value], count)
    return family


# --- the meter's figures ----------------------------------------------------------------


class DeviceFigures(Protocol):
    """One device at the meter's last sample (service/telemetry/meter.py's `DeviceReading`)."""

    @property
    def key(self) -> SlotKey: ...
    @property
    def used_bytes(self) -> int: ...
    @property
    def foreign_bytes(self) -> int: ...


class EngineFigures(Protocol):
    """One deployment's engines at the last sample (`EngineReading`); None: not measurable."""

    @property
    def used_bytes(self) -> int | None: ...


class MeterSample(Protocol):
    @property
    def devices(self) -> Sequence[DeviceFigures]: ...
    @property
    def deployments(self) -> Mapping[str, EngineFigures]: ...


class MeterReadings(Protocol):
    """What the collector reads of the server's meter: its last sample."""

    def latest(self) -> MeterSample: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Metered:
    devices: Mapping[SlotKey, tuple[int, int]] = field(default_factory=dict)  # used, foreign
    deployments: Mapping[str, int] = field(default_factory=dict)  # used


def metered(meter: MeterReadings | None) -> Metered:
    """The meter's last figures: none without a meter or before its first sample, and no
    engine figure where it could not measure one."""
    if meter is None:
        return Metered()
    sample = meter.latest()
    return Metered(
        devices={d.key: (d.used_bytes, d.foreign_bytes) for d in sample.devices},
        deployments={
            deployment_id: engine.used_bytes
            for deployment_id, engine in sample.deployments.items()
            if engine.used_bytes is not None
        },
    )


# --- read at scrape time ----------------------------------------------------------------


class StateCollector:
    """A custom collector: each scrape reads the ledger's snapshot (its parsed fleet is
    cached; the reservations are one query), the active deployments (one query) and the
    gateway's counters (in memory). Deployments that ended are left out, so the series
    stay as many as the deployments alive."""

    def __init__(
        self,
        db: Database,
        activity: Activity,
        meter: MeterReadings | None = None,
    ) -> None:
        self.db = db
        self.activity = activity
        self.meter = meter

    def collect(self) -> Iterator[Metric]:
        state = ledger.current_state(self.db)
        active = deployments.list_active(self.db)
        measured = metered(self.meter)
        yield from _devices(state.slots, state.used_bytes(), measured)
        held: dict[str, tuple[int, int]] = {}  # bytes, reservations per deployment
        for reservation in state.reservations:
            total, count = held.get(reservation.deployment, (0, 0))
            held[reservation.deployment] = (total + reservation.reserved_bytes, count + 1)
        groups = copyset.by_deployment(active)
        yield from _deployments(groups, held, measured)
        traffic = self.activity.snapshot()  # counted under the deployment's id
        yield from _traffic([(rows[0], traffic.get(i, Usage())) for i, rows in groups.items()])


def _device_labels(slot: Slot) -> list[str]:
    def text(index: int | None) -> str:
        return "" if index is None else str(index)

    return [slot.node, text(slot.gpu_index), text(slot.partition_index), slot.kind.value]


def _devices(
    slots: tuple[Slot, ...], reserved: Mapping[SlotKey, int], measured: Metered
) -> Iterator[Metric]:
    total = GaugeMetricFamily(
        "cohabit_device_memory_bytes",
        "Memory of the device (GPU, partition or memory pool).",
        labels=DEVICE_LABELS,
    )
    capacity = GaugeMetricFamily(
        "cohabit_device_capacity_bytes",
        "Bytes placement may reserve on the device (a pool's memory less the OS reserve).",
        labels=DEVICE_LABELS,
    )
    held = GaugeMetricFamily(
        "cohabit_device_reserved_bytes",
        "Bytes reserved on the device by deployments.",
        labels=DEVICE_LABELS,
    )
    used = GaugeMetricFamily(
        "cohabit_device_used_bytes",
        "Bytes in use on the device, as the meter last measured them.",
        labels=DEVICE_LABELS,
    )
    foreign = GaugeMetricFamily(
        "cohabit_device_foreign_bytes",
        "Bytes in use on the device by processes cohabit did not start (meter).",
        labels=DEVICE_LABELS,
    )
    for slot in slots:
        labels = _device_labels(slot)
        total.add_metric(labels, slot.total_bytes)
        capacity.add_metric(labels, slot.capacity_bytes)
        held.add_metric(labels, reserved.get(slot.key, 0))
        figures = measured.devices.get(slot.key)
        if figures is not None:
            used.add_metric(labels, figures[0])
            foreign.add_metric(labels, figures[1])
    yield from (total, capacity, held, used, foreign)


def _deployments(
    groups: Mapping[str, list[DeploymentRecord]],
    held: Mapping[str, tuple[int, int]],
    measured: Metered,
) -> Iterator[Metric]:
    """One series per deployment, summed over its copies (`groups`: its active rows); its
    status is the one shown (DEPLOYED while a copy serves)."""
    budget = GaugeMetricFamily(
        "cohabit_deployment_budget_bytes",
        "Bytes the deployment holds across its devices (0 until it is placed).",
        labels=DEPLOYMENT_LABELS,
    )
    used = GaugeMetricFamily(
        "cohabit_deployment_used_bytes",
        "Bytes the deployment's engine processes hold, as the meter last measured them.",
        labels=DEPLOYMENT_LABELS,
    )
    state = GaugeMetricFamily(
        "cohabit_deployment_status",
        "1 for the deployment's current status, 0 for the others.",
        labels=(*DEPLOYMENT_LABELS, "status"),
    )
    copies = GaugeMetricFamily(
        "cohabit_deployment_copies",
        "Copies of the deployment holding a budget (reservations over tensor-parallel size).",
        labels=DEPLOYMENT_LABELS,
    )
    ready = GaugeMetricFamily(
        "cohabit_deployment_ready_copies",
        "Copies of the deployment that serve now (the gateway balances over them).",
        labels=DEPLOYMENT_LABELS,
    )
    for deployment_id, group in groups.items():
        labels = [deployment_id, group[0].model_name]
        holdings = [held.get(copy.id, (0, 0)) for copy in group]
        budget.add_metric(labels, sum(bytes_held for bytes_held, _ in holdings))
        tensor_parallel = max(1, group[0].tensor_parallel)  # shared by its copies
        copies.add_metric(labels, sum(n for _, n in holdings) // tensor_parallel)
        ready.add_metric(labels, len(copyset.serving(group)))
        shown = copyset.status_of(group)
        for status in DeploymentStatus:
            state.add_metric([*labels, status.value], 1 if shown is status else 0)
        figures = [measured.deployments[c.id] for c in group if c.id in measured.deployments]
        if figures:
            used.add_metric(labels, sum(figures))
    yield from (budget, used, state, copies, ready)


def _traffic(usages: list[tuple[DeploymentRecord, Usage]]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "cohabit_gateway_requests",
        "Requests the gateway finished for the deployment, whatever their answer.",
        labels=DEPLOYMENT_LABELS,
    )
    errors = CounterMetricFamily(
        "cohabit_gateway_request_errors",
        "Requests that ended with a 5xx or a broken connection.",
        labels=DEPLOYMENT_LABELS,
    )
    tokens = CounterMetricFamily(
        "cohabit_gateway_completion_tokens",
        "Tokens the deployment's engine generated, as its answers reported them.",
        labels=DEPLOYMENT_LABELS,
    )
    in_flight = GaugeMetricFamily(
        "cohabit_gateway_requests_in_flight",
        "Requests to the deployment the gateway is proxying now.",
        labels=DEPLOYMENT_LABELS,
    )
    latency = HistogramMetricFamily(
        "cohabit_gateway_request_duration_seconds",
        "Time from a request entering the gateway to its answer's end.",
        labels=DEPLOYMENT_LABELS,
    )
    for record, usage in usages:
        labels = [record.deployment_id, record.model_name]
        requests.add_metric(labels, usage.requests)
        errors.add_metric(labels, usage.errors)
        tokens.add_metric(labels, usage.completion_tokens)
        in_flight.add_metric(labels, usage.in_flight)
        latency.add_metric(
            labels, _cumulative(LATENCY_BUCKETS_S, usage.buckets), usage.seconds_total
        )
    yield from (requests, errors, tokens, in_flight, latency)


def _cumulative(upper_bounds: tuple[float, ...], buckets: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (as `Usage.buckets`) as Prometheus' cumulative `le` buckets, +Inf
    last."""
    bounds = [*(repr(float(bound)) for bound in upper_bounds), "+Inf"]
    running = 0
    result: list[tuple[str, float]] = []
    for bound, count in zip(bounds, buckets, strict=True):
        running += count
        result.append((bound, running))
    return result


class ServerMetrics:
    """One app's registry: the reconciler's counters from the start, the state collector
    once the database is open (`watch`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciler = ReconcilerCounters()
        self.registry.register(self.reconciler)

    def watch(self, collector: Collector) -> None:
        self.registry.register(collector)

    def exposition(self) -> bytes:
        """The text format (0.0.4) of every family; raises what a store read raises."""
        return generate_latest(self.registry)
