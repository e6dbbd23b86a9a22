"""What the web page draws, worked out from the ledger and the deployment records: the fleet
map (each GPU, partition or pool as a bar split into the budgets held on it and the free
rest), the deployments table and one deployment's details with its timeline. `pages.py`
renders these."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from cohabit.hardware.slots import Slot, SlotKey, SlotKind
from cohabit.placement.state import FleetState
from cohabit.service.api.schemas import Deployment
from cohabit.service.api.ui.fixes import fix_for
from cohabit.store.deployments import Named
from cohabit.store.events import EventKind, EventRecord
from cohabit.store.records import ACTIVE, DeploymentStatus
from cohabit.units import GIB, MIB, format_age, format_gib

# Status → the tone its badge is drawn in (the badge also says the status in words).
TONES: Mapping[str, str] = {
    DeploymentStatus.REQUESTED: "waiting",
    DeploymentStatus.DEPLOYING: "waiting",
    DeploymentStatus.INITIALIZING: "waiting",
    DeploymentStatus.DEPLOYED: "ok",
    DeploymentStatus.UNLOADED: "idle",  # scaled to zero: loads on the next request
    DeploymentStatus.QUEUED: "waiting",  # waiting for room
    DeploymentStatus.STOPPED: "ended",
    DeploymentStatus.ERROR: "bad",
    DeploymentStatus.FAILED: "bad",
    DeploymentStatus.MUST_REDOWNLOAD: "bad",
}


def size_text(size_bytes: int) -> str:
    """A size for people: GiB, or MiB below 1 GiB so small budgets do not read as zero."""
    if size_bytes >= GIB or size_bytes == 0:
        return format_gib(size_bytes)
    return f"{size_bytes / MIB:.1f} MiB".replace(".0 MiB", " MiB")


def hue(deployment_id: str) -> int:
    """A stable colour per deployment, so its bar segment and its table row match."""
    return int(hashlib.sha1(deployment_id.encode()).hexdigest()[:6], 16) % 360


def percent(part: int, whole: int) -> str:
    """A CSS width: `part` of `whole` as a percentage (0% for an empty whole)."""
    return f"{(100.0 * part / whole) if whole else 0.0:.4f}%"


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """One deployment's budget on one slot."""

    deployment_id: str
    name: str
    status: str
    reserved_bytes: int
    width: str
    hue: int

    @property
    def label(self) -> str:
        return f"{self.name} {size_text(self.reserved_bytes)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SlotBar:
    """A GPU, partition or pool as a bar of `total_bytes`: holdings, the free remainder and,
    for pools, the OS reserve placement never hands out."""

    dom_id: str
    location: str
    kind: str
    title: str
    hardware_class: str
    sharing_class: str
    total_bytes: int
    capacity_bytes: int
    free_bytes: int
    holdings: tuple[Holding, ...]
    free_width: str
    reserve_width: str
    exclusive: bool
    schedulable: bool
    notices: tuple[str, ...]
    # What the meter last measured there (None: not measured): memory cohabit's engines use
    # and memory held outside cohabit, with their widths on the bar.
    cohabit_bytes: int | None = None
    foreign_bytes: int | None = None
    cohabit_width: str = "0%"
    foreign_width: str = "0%"

    @property
    def measured_summary(self) -> str:
        """The measured line in words (its accessible name)."""
        used, foreign = size_text(self.cohabit_bytes or 0), size_text(self.foreign_bytes or 0)
        return f"measured: {used} used by cohabit's engines, {foreign} held outside cohabit"

    @property
    def reserved_bytes(self) -> int:
        return sum(h.reserved_bytes for h in self.holdings)

    @property
    def summary(self) -> str:
        """The bar in words (its accessible name): held, free and capacity."""
        held = ", ".join(h.label for h in self.holdings) or "nothing held"
        free, capacity = size_text(self.free_bytes), size_text(self.capacity_bytes)
        return f"{self.location}: {held}; {free} free of {capacity}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionedGpu:
    """A GPU cut into hardware partitions (MIG, AMD): drawn as one frame whose cells are its
    partitions, each as wide as its share of the card; `unpartitioned_width` is the rest."""

    dom_id: str
    title: str
    total_bytes: int
    partitions: tuple[tuple[SlotBar, str], ...]  # each partition and its width on the card
    unpartitioned_width: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeMap:
    name: str
    os: str
    schedulable: bool
    items: tuple[SlotBar | PartitionedGpu, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetMap:
    topology: str
    nodes: tuple[NodeMap, ...]
    reserved_bytes: int
    capacity_bytes: int


def fleet_map(
    state: FleetState,
    holders: Mapping[str, Named],
    gpu_memory: Mapping[str, int],
    measured: Mapping[SlotKey, tuple[int, int]] | None = None,
) -> FleetMap:
    """The map of `state`; `holders` names the rows holding budget (a copy's budget is drawn
    as its deployment's, in its colour and linked to it), `gpu_memory` is each partitioned
    GPU's card memory by "node/index", and `measured` what the meter last read per slot:
    (bytes cohabit's engines use, bytes held outside cohabit)."""
    measured = measured or {}
    free = state.free_bytes()
    held: dict[SlotKey, list[Holding]] = {}
    totals = {slot.key: slot.total_bytes for slot in state.slots}
    for reservation in state.reservations:
        holder = holders.get(reservation.deployment)
        deployment_id = holder.deployment_id if holder else reservation.deployment
        name = holder.name if holder else reservation.deployment[:8]
        held.setdefault(reservation.slot_key, []).append(
            Holding(
                deployment_id=deployment_id,
                name=f"{name} copy {holder.copy_index}" if holder and holder.copy_index else name,
                status=holder.status.value if holder else "",
                reserved_bytes=reservation.reserved_bytes,
                width=percent(reservation.reserved_bytes, totals.get(reservation.slot_key, 0)),
                hue=hue(deployment_id),
            )
        )
    nodes: list[NodeMap] = []
    for node in state.fleet.nodes:
        slots = [s for s in state.slots if s.node == node.name]
        bars = [
            _bar(s, tuple(held.get(s.key, ())), free[s.position], measured.get(s.key))
            for s in slots
        ]
        nodes.append(
            NodeMap(
                name=node.name,
                os=node.os,
                schedulable=node.schedulable,
                items=tuple(_group_partitions(node.name, slots, bars, gpu_memory)),
            )
        )
    return FleetMap(
        topology=state.fleet.topology.value,
        nodes=tuple(nodes),
        reserved_bytes=sum(r.reserved_bytes for r in state.reservations),
        capacity_bytes=sum(s.capacity_bytes for s in state.slots),
    )


def _bar(
    slot: Slot,
    holdings: tuple[Holding, ...],
    free_bytes: int,
    measured: tuple[int, int] | None = None,
) -> SlotBar:
    if slot.kind is SlotKind.POOL:
        title = f"{'CPU' if slot.product == 'CPU' else slot.product} · memory pool"
    elif slot.kind is SlotKind.PARTITION:
        title = f"{slot.partition_profile} #{slot.partition_index}"
    else:
        title = f"GPU {slot.gpu_index} · {slot.product}"
    reserve = max(0, slot.total_bytes - slot.capacity_bytes)
    key = "-".join(str(part) for part in slot.key if part is not None)
    return SlotBar(
        dom_id=f"slot-{key}".replace(" ", "_"),
        location=slot.location,
        kind=slot.kind.value,
        title=title,
        hardware_class=slot.hardware_class.value,
        sharing_class=slot.sharing_class,
        total_bytes=slot.total_bytes,
        capacity_bytes=slot.capacity_bytes,
        free_bytes=free_bytes,
        holdings=holdings,
        free_width=percent(free_bytes, slot.total_bytes),
        reserve_width=percent(reserve, slot.total_bytes),
        exclusive=slot.exclusive,
        schedulable=slot.schedulable,
        notices=tuple(code.value for code in slot.notices),
        cohabit_bytes=None if measured is None else measured[0],
        foreign_bytes=None if measured is None else measured[1],
        cohabit_width="0%" if measured is None else percent(measured[0], slot.total_bytes),
        foreign_width="0%" if measured is None else percent(measured[1], slot.total_bytes),
    )


def _group_partitions(
    node: str, slots: Sequence[Slot], bars: Sequence[SlotBar], gpu_memory: Mapping[str, int]
) -> list[SlotBar | PartitionedGpu]:
    """Plain GPUs and pools as they are; the partitions of one GPU gathered into its frame,
    which takes the place of its first partition."""
    items: list[SlotBar | list[tuple[Slot, SlotBar]]] = []
    frames: dict[int, list[tuple[Slot, SlotBar]]] = {}
    for slot, bar in zip(slots, bars, strict=True):
        if slot.kind is SlotKind.PARTITION and slot.gpu_index is not None:
            if slot.gpu_index not in frames:
                frames[slot.gpu_index] = []
                items.append(frames[slot.gpu_index])
            frames[slot.gpu_index].append((slot, bar))
        else:
            items.append(bar)
    return [item if isinstance(item, SlotBar) else _frame(node, item, gpu_memory) for item in items]


def _frame(
    node: str, members: list[tuple[Slot, SlotBar]], gpu_memory: Mapping[str, int]
) -> PartitionedGpu:
    first = members[0][0]
    parted = sum(slot.total_bytes for slot, _bar in members)
    card = max(gpu_memory.get(f"{node}/{first.gpu_index}", 0), parted)
    return PartitionedGpu(
        dom_id=f"gpu-{node}-{first.gpu_index}".replace(" ", "_"),
        title=f"GPU {first.gpu_index} · {first.product} · partitioned",
        total_bytes=card,
        partitions=tuple((bar, percent(slot.total_bytes, card)) for slot, bar in members),
        unpartitioned_width=percent(card - parted, card),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyLine:
    """One copy of a deployment with a started engine: which, its status, where it runs."""

    index: int
    status: str
    tone: str
    where: str
    allocated: str
    pid: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Loading:
    """A load under way as the page shows it: "engine_load 1.2 s" (the page's script counts
    the seconds on between its polls), and the phases it has finished."""

    phase: str
    elapsed_s: float
    finished: tuple[tuple[str, str], ...]  # (phase, "0.41 s"), in order

    @property
    def text(self) -> str:
        return f"{self.phase} {self.elapsed_s:.1f} s"


def loading(view: Deployment) -> Loading | None:
    """The load under way in `view` (its `loading` field), if any."""
    progress = view.loading
    if progress is None:
        return None
    finished = tuple((name, f"{seconds:.2f} s") for name, seconds in progress.phases_s.items())
    return Loading(phase=progress.phase, elapsed_s=progress.elapsed_s, finished=finished)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeploymentRow:
    """One line of the deployments table."""

    id: str
    name: str
    status: str
    tone: str
    where: str
    hardware_class: str
    sharing_class: str
    allocated: str
    endpoint: str | None
    age: str
    active: bool
    hue: int
    over_budget: bool = False  # the meter found its engine above its budget
    copies: str = ""  # "2/2": copies serving over copies now; "" once it has ended
    copy_lines: tuple[CopyLine, ...] = ()  # its copies with a started engine, by index
    queue_position: int | None = None  # its place in the queue while QUEUED
    # Its measured memory against its budget over the meter's recent samples: the points of
    # an SVG polyline (SPARK_WIDTH × SPARK_HEIGHT, the budget at the top); None before two.
    sparkline: str | None = None
    sparkline_label: str = ""
    loading: Loading | None = None  # its load's current phase, while it loads


@dataclass(frozen=True, slots=True, kw_only=True)
class Details:
    """The details view: the row, every placement field, the error and its fix, the NoFit's
    numbers, the estimate and the log tail."""

    row: DeploymentRow
    fields: tuple[tuple[str, str], ...]
    notices: tuple[str, ...]
    error_code: str | None
    error_message: str | None
    error_at: str | None
    fix: str | None
    no_fit: tuple[tuple[str, str], ...]
    estimate: tuple[tuple[str, str], ...]
    logs: tuple[str, ...]


SPARK_WIDTH = 80
SPARK_HEIGHT = 16


def sparkline(samples: Sequence[tuple[int | None, int]]) -> str | None:
    """Polyline points for (used bytes, budget bytes) samples, oldest first: x spreads them
    over the width, y is used over budget (the top edge is the budget; above it is clipped
    at the top). Samples without a figure are skipped; None with fewer than two."""
    known = [(used, budget) for used, budget in samples if used is not None and budget > 0]
    if len(known) < 2:
        return None
    step = SPARK_WIDTH / (len(known) - 1)
    points = []
    for i, (used, budget) in enumerate(known):
        share = min(1.0, used / budget)
        points.append(f"{i * step:.1f},{SPARK_HEIGHT * (1 - share):.1f}")
    return " ".join(points)


def deployment_row(
    view: Deployment, now: datetime, history: Sequence[tuple[int | None, int]] = ()
) -> DeploymentRow:
    """`history`: the meter's recent (used, budget) samples of its engine, oldest first."""
    status = view.status
    allocated = "—" if view.allocated_bytes is None else size_text(view.allocated_bytes)
    if view.memory_used_bytes is not None:  # measured: "used / budget"
        allocated = f"{size_text(view.memory_used_bytes)} / {allocated}"
    memory = view.health_details.get("memory") or {}
    return DeploymentRow(
        id=str(view.id),
        name=view.m_name,
        status=status,
        tone=TONES.get(status, "waiting"),
        where=where(view),
        hardware_class=view.hardware_class or "—",
        sharing_class=view.sharing_class or "—",
        allocated=allocated,
        endpoint=endpoint(view),
        age=age(view.requested_at, now),
        active=status in ACTIVE,
        hue=hue(str(view.id)),
        over_budget=bool(memory.get("over_budget")),
        copies=f"{view.ready_copies}/{view.copies}" if status in ACTIVE else "",
        copy_lines=copy_lines(view),
        queue_position=queue_position(view),
        sparkline=sparkline(history),
        sparkline_label=f"memory used against its budget, last {len(history)} samples",
        loading=loading(view),
    )


def where(view: Deployment) -> str:
    """ "node-a gpu 0", "node-a gpu 0,1", "node-a gpu 1 mig 3g.20gb", "spark pool"; "—"
    before placement."""
    return place(view.node_name, view.gpu_indices, view.partition)


def place(node: str | None, gpu_indices: Sequence[int], partition: str | None) -> str:
    """A place in words (see `where`)."""
    if node is None:
        return "—"
    if not gpu_indices:
        return f"{node} pool"
    text = f"{node} gpu {','.join(map(str, gpu_indices))}"
    return f"{text} {partition}" if partition else text


def queue_position(view: Deployment) -> int | None:
    """Its place in the queue while it waits for room."""
    if view.status != DeploymentStatus.QUEUED or view.no_fit is None:
        return None
    position = (view.no_fit.model_extra or {}).get("queue_position")
    return position if isinstance(position, int) else None


def copy_lines(view: Deployment) -> tuple[CopyLine, ...]:
    """Its copies with a started engine (its instances), by copy index."""
    lines = []
    for instance in view.instances:
        extra = instance.extra_details
        status = str(extra.get("copy_status") or instance.status)
        allocated = extra.get("allocated_bytes")
        lines.append(
            CopyLine(
                index=int(extra.get("copy_index", 0)),
                status=status,
                tone=TONES.get(status, "waiting"),
                where=place(
                    instance.host_name, extra.get("gpu_indices") or [], extra.get("partition")
                ),
                allocated=size_text(allocated) if isinstance(allocated, int) else "—",
                pid=instance.container_id,
            )
        )
    return tuple(sorted(lines, key=lambda line: line.index))


def endpoint(view: Deployment) -> str | None:
    """Its OpenAI-compatible root through the gateway (service/paths.py `access_path`), while
    it has a started engine. Never an engine's own port: that would skip the gateway's token
    check and its choice among the copies."""
    started = any(instance.extra_details.get("base_url") for instance in view.instances)
    return f"{view.access_path}/v1" if started and view.access_path else None


def age(since: datetime, now: datetime) -> str:
    """ "12 s", "5 min", "3 h", "2 d": how long ago it was requested."""
    return format_age((now - since).total_seconds())


def details(view: Deployment, now: datetime, logs: Sequence[str]) -> Details:
    no_fit = view.no_fit.model_dump() if view.no_fit is not None else None
    return Details(
        row=deployment_row(view, now),
        fields=tuple(_placement_fields(view)),
        notices=tuple(view.notices),
        error_code=view.last_error_code,
        error_message=view.last_error_message,
        error_at=None if view.last_error_at is None else _moment(view.last_error_at),
        fix=fix_for(view.last_error_code, no_fit),
        no_fit=tuple(_no_fit_fields(no_fit)) if no_fit else (),
        estimate=tuple(estimate_fields(view.estimate)) if view.estimate else (),
        logs=tuple(logs),
    )


# Event kind → the tone its line is marked with (the line also names the kind in words).
EVENT_TONES: Mapping[str, str] = {
    EventKind.HEALTHY: "ok",
    EventKind.NO_FIT: "bad",
    EventKind.FAILED: "bad",
    EventKind.OVER_BUDGET: "bad",
    EventKind.STOPPED: "ended",
    EventKind.UNLOADED: "ended",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineLine:
    """One step of a deployment's timeline as the details view lists it."""

    at: str
    iso: str
    kind: str
    tone: str
    message: str


def timeline(steps: Iterable[EventRecord]) -> tuple[TimelineLine, ...]:
    return tuple(
        TimelineLine(
            at=_moment(step.at),
            iso=step.at.isoformat(),
            kind=step.kind,
            tone=EVENT_TONES.get(step.kind, "waiting"),
            message=step.message,
        )
        for step in steps
    )


def _moment(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _text(value: object) -> str:
    if value is None or value == []:
        return "—"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _placement_fields(view: Deployment) -> Iterable[tuple[str, str]]:
    """Every field the record shows about where it landed and what it holds."""
    yield "id", str(view.id)
    yield "engine_name", _text(view.engine_name)
    yield "m_config_id", str(view.m_config_id)
    for name in (
        "topology",
        "node_name",
        "gpu_index",
        "gpu_indices",
        "partition",
        "gpu_vendor",
        "gpu_id",
        "hardware_class",
        "sharing_class",
        "allocated_capacity_gb",
    ):
        yield name, _text(getattr(view, name))
    allocated = view.allocated_bytes
    yield "allocated_bytes", "—" if allocated is None else f"{allocated:,} ({size_text(allocated)})"
    yield "requested_bytes", f"{view.requested_bytes:,} ({size_text(view.requested_bytes)})"
    utilization = view.gpu_memory_utilization
    yield "gpu_memory_utilization", "—" if utilization is None else f"{utilization:.4f}"
    yield "tensor_parallel_size", str(view.tensor_parallel_size)
    for name in ("requested_at", "deployed_at", "stopped_at"):
        moment = getattr(view, name)
        yield name, "—" if moment is None else _moment(moment)


def _no_fit_fields(no_fit: Mapping[str, object]) -> Iterable[tuple[str, str]]:
    yield "reason", _text(no_fit.get("reason"))
    requested = no_fit.get("requested_bytes")
    if isinstance(requested, int):
        yield "requested", size_text(requested)
    largest = no_fit.get("largest_free_bytes")
    if isinstance(largest, int):
        where_free = no_fit.get("largest_free_location") or "nowhere"
        yield "largest free budget", f"{size_text(largest)} on {where_free}"
    yield "message", _text(no_fit.get("message"))


ESTIMATE_PARTS = (
    ("weights_bytes", "weights"),
    ("kv_cache_bytes", "KV cache"),
    ("activation_bytes", "activations"),
    ("overhead_bytes", "overhead"),
    ("total_bytes", "total per device"),
)


def estimate_fields(estimate: Mapping[str, object]) -> Iterable[tuple[str, str]]:
    """The estimator's breakdown in GiB, and the context it was sized for."""
    for key, label in ESTIMATE_PARTS:
        value = estimate.get(key)
        if isinstance(value, int):
            yield label, size_text(value)
    if estimate.get("max_model_len") is not None:
        yield "context length", f"{estimate['max_model_len']:,} tokens"
