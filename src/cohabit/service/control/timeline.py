"""What the service writes on a deployment's timeline (store/events.py keeps it): one
function per lifecycle step, in words for people and numbers for scripts. Admission records
`requested`, the API's stop `stopped`, the
reconciler the rest (placed, reserved, started, engine_imported, weights_loaded, healthy,
first_token, no_fit, failed).

Writing an event never fails the step it describes: `note` logs a failed write and returns,
so a database hiccup loses a line of history, never a deployment. `requested` is written
in the transaction that inserts the deployment (under a savepoint, so the same rule holds),
so no reconciler can write `placed` before it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cohabit.placement.decision import Placement
from cohabit.runtime.interface import EngineHandle, Milestone, MilestoneSeen
from cohabit.service.control import loadphases
from cohabit.store import deployments, events
from cohabit.store.database import Database, utcnow
from cohabit.store.events import EventKind, EventRecord
from cohabit.store.records import (
    HOLDING,
    NO_FIT_ERROR,
    DeploymentFailure,
    DeploymentRecord,
    NewDeployment,
)
from cohabit.units import format_gib

log = logging.getLogger(__name__)

# How admission sized a deployment (Sizing.source), in words.
SOURCES: Mapping[str, str] = {
    "override": "the vram_allocation it asked for",
    "exact": "estimated from the model's weights on disk",
    "derived": "estimated from the model's shape",
    "recorded": "the catalog's recorded file sizes (the files are gone)",
}


def note(db: Database, deployment_id: str, kind: EventKind, message: str, **data: Any) -> None:
    """Append one event; a fault writing it is logged, never raised."""
    _write(db, deployment_id, [(kind, message, data or None)])


def _write(db: Database, deployment_id: str, steps: list[events.Step]) -> None:
    try:
        events.record_steps(db, deployment_id, steps)
    except Exception:
        kinds = ", ".join(kind.value for kind, _message, _data in steps)
        log.exception("recording the %s event of deployment %s failed", kinds, deployment_id)


def size(size_bytes: int) -> str:
    """Sizes in event messages: GiB with two decimals, so a tiny model's MiB do not read 0."""
    return format_gib(size_bytes, digits=2)


def requested(new: NewDeployment, *, source: str) -> events.Step:
    """Admitted: the model, the engine and the bytes per device it was sized at, and how.
    The step that `deployments.create` writes with the deployment's row."""
    how = SOURCES.get(source, source)
    shards = f" on each of {new.tensor_parallel} devices" if new.tensor_parallel > 1 else ""
    message = (
        f"{new.model_name} on {new.engine}: {size(new.requested_bytes)} per device{shards} ({how})"
    )
    data = {
        "model": new.model_name,
        "engine": new.engine,
        "requested_bytes": new.requested_bytes,
        "source": source,
        "tensor_parallel": new.tensor_parallel,
        "max_model_len": new.max_model_len,
    }
    return (EventKind.REQUESTED, message, data)


def placed(
    db: Database,
    deployment_id: str,
    placement: Placement,
    *,
    preemption: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """Two events, written together (they happen in one ledger transaction): `placed`, where
    it landed and the planner's reason, and `reserved`, the budget held per device. A
    placement that first unloaded idle copies (`preemption`: its explanation and the copies
    unloaded) says so in `placed`."""
    locations = [allocation.slot.location for allocation in placement.allocations]
    why = placement.why or "the devices it held before"
    where = {
        "node": placement.node,
        "locations": locations,
        "gpu_indices": placement.gpu_indices,
        "partition": placement.partition,
        "hardware_class": placement.hardware_class.value,
        "sharing_class": placement.sharing_class,
        "why": placement.why,
        "notices": [code.value for code in placement.notices],
    }
    held = [
        {"location": a.slot.location, "node": a.slot.node, "gpu_index": a.slot.gpu_index,
         "partition_index": a.slot.partition_index, "reserved_bytes": a.allocated_bytes}
        for a in placement.allocations
    ]  # fmt: skip
    text = "; ".join(
        f"{size(a.allocated_bytes)} on {a.slot.location}" for a in placement.allocations
    )
    total = sum(a.allocated_bytes for a in placement.allocations)
    placed_text = f"on {', '.join(locations)}: {why}"
    if preemption is not None:
        placed_text = f"{preemption[0]}; {why}"
        where |= preemption[1]
    _write(
        db,
        deployment_id,
        [
            (EventKind.PLACED, placed_text, where),
            (EventKind.RESERVED, f"holds {text}", {"reservations": held, "total_bytes": total}),
        ],
    )


def started(db: Database, deployment_id: str, engine: str, handle: EngineHandle) -> None:
    """The engine launched: its pid where it runs as a local process (none yet while it
    waits behind another engine's start-up on its device, or as a pod), and its port."""
    known = {"pid": handle.pid, "port": handle.port}
    parts = [f"{name} {value}" for name, value in known.items() if value is not None]
    text = f"{engine} engine started" + (f": {', '.join(parts)}" if parts else "")
    note(
        db,
        deployment_id,
        EventKind.STARTED,
        text,
        engine=engine,
        pid=handle.pid,
        port=handle.port,
        base_url=handle.base_url,
        log_path=handle.log_path,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPhases:
    """One load's phases in seconds (loadphases.PHASES, those known), and its engine."""

    engine: str
    seconds: dict[str, float]


def load_phases(recent: list[EventRecord], ready_at: datetime) -> LoadPhases | None:
    """The phases of the last load in `recent` (a deployment's events, oldest first), ready
    at `ready_at`; None when its placement or its start is not there."""
    at = loadphases.moments(recent)
    started = next((e for e in reversed(recent) if e.kind == EventKind.STARTED.value), None)
    if started is None or not {EventKind.PLACED.value, EventKind.STARTED.value} <= at.keys():
        return None
    at[EventKind.HEALTHY.value] = ready_at
    seconds = loadphases.phase_seconds(at)
    return LoadPhases(engine=str((started.data or {}).get("engine", "")), seconds=seconds)


def milestone(db: Database, deployment_id: str, seen: MilestoneSeen) -> None:
    """The engine's log showed a milestone of its load (`seen`, at the poll that found it):
    its code imported and the model opened, or its weights loaded; with the engine's line."""
    note(
        db,
        deployment_id,
        EventKind(seen.milestone.value),
        f"{_MILESTONE_TEXT[seen.milestone]} (its log: {seen.line.strip()})",
        seen_at=seen.at.isoformat(),
        line=seen.line,
    )


_MILESTONE_TEXT = {
    Milestone.ENGINE_IMPORTED: "engine imported, reading the model",
    Milestone.WEIGHTS_LOADED: "weights loaded",
}


def healthy(db: Database, deployment_id: str, *, pid: int | None) -> LoadPhases | None:
    """The engine answers: how long from the request to serving, and the phases of this
    load (`load_phases`), which it returns."""
    try:
        record = deployments.get(db, deployment_id)
    except Exception:
        log.exception("reading deployment %s for its timeline failed", deployment_id)
        return None
    ready_at = record.deployed_at or utcnow()
    waited_s = round((ready_at - record.requested_at).total_seconds(), 3)
    try:
        recent = events.latest(db, deployment_id, limit=loadphases.RECENT_EVENTS)
        phases = load_phases(recent, ready_at)
    except Exception:
        log.exception("reading the events of deployment %s failed", deployment_id)
        phases = None
    text = f"serving {waited_s:.1f} s after it was requested"
    if phases is not None:
        said = phases.seconds
        text += (
            f"; this load: placed in {said['placing']:.2f} s, its engine process started "
            f"{said['starting']:.2f} s later and answered {said['engine_load']:.2f} s after that"
        )
        parts = [f"{name} {said[name]:.2f} s" for name in loadphases.ENGINE_PARTS if name in said]
        if parts:
            text += f" ({', '.join(parts)})"
    note(
        db,
        deployment_id,
        EventKind.HEALTHY,
        text,
        seconds_from_request=waited_s,
        pid=pid,
        **({"load_phases_s": phases.seconds} if phases else {}),
    )
    return phases


def first_token(db: Database, deployment_id: str, *, seconds: float) -> None:
    """The first answer to a request held for this load began coming back from its engine,
    `seconds` after it was ready."""
    note(
        db,
        deployment_id,
        EventKind.FIRST_TOKEN,
        f"first answer to a request held for this load began {seconds:.2f} s after it was ready",
        seconds=seconds,
    )


def ended(db: Database, deployment_id: str, failure: DeploymentFailure) -> None:
    """A failure the reconciler recorded: a NoFit (`no_fit`, with its numbers) or an engine
    or driving fault (`failed`, with its code)."""
    if failure.code == NO_FIT_ERROR:
        details = dict(failure.no_fit or {})
        note(
            db,
            deployment_id,
            EventKind.NO_FIT,
            failure.message,
            reason=details.get("reason"),
            requested_bytes=details.get("requested_bytes"),
            largest_free_bytes=details.get("largest_free_bytes"),
            largest_free_location=details.get("largest_free_location"),
            hint=details.get("hint"),
            status=failure.status.value,
        )
        return
    note(
        db,
        deployment_id,
        EventKind.FAILED,
        f"{failure.code}: {failure.message}",
        code=failure.code,
        status=failure.status.value,
    )


def stopped(
    db: Database, deployment: DeploymentRecord, *, by: str | None, reason: str | None = None
) -> None:
    """Stopped through the API, by `by` (the caller's token name) when known, or by the
    server for `reason` (a policy); `deployment` as it was before."""
    released = "; its budget is released" if deployment.status in HOLDING else ""
    if reason is not None:
        message = f"stopped: {reason} (was {deployment.status.value}){released}"
        via = "server"
    else:
        who = "" if by is None else f" by {by}"
        message = f"stopped{who} through the API (was {deployment.status.value}){released}"
        via = "api"
    # A policy's stop says why; one through the API says who.
    why: dict[str, Any] = {"by": by} if reason is None else {"reason": reason}
    note(
        db,
        deployment.id,
        EventKind.STOPPED,
        message,
        **why,
        via=via,
        status_before=deployment.status.value,
    )
