"""/api/serving: deploy, estimate, list, get, status, logs (per deployment and per engine),
events, stop, instances, health. Each route parses, calls `service.control.admission` or the
store, and maps records to schemas. Deploying and stopping need an admin token.

A deployment is shown with all its copies (store/copyset.py): its status is DEPLOYED while
any copy serves, and `instances` has one entry per copy with a started engine. A copy's own
id is no deployment's: the routes here answer a 404 naming the deployment it belongs to."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Query, Request, Response, status

from cohabit.runtime.engines import ENGINES
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.probe import TAIL_LINES, analyze_log
from cohabit.runtime.process import process_facts
from cohabit.service import paths
from cohabit.service.api import fleet_ids
from cohabit.service.api.deployment_pages import DeploymentPages
from cohabit.service.api.deps import AdminOnly, Authorized, Caller, Context
from cohabit.service.api.paging import DEPLOYMENTS_LIMIT, MAX_LIMIT, Limit, Offset
from cohabit.service.api.schemas import (
    GUARDED,
    ContainerLogListResponse,
    ContainerLogPatternResponse,
    ContainerLogResponse,
    CreateModelDeployment,
    Deployment,
    DeploymentEvent,
    DeploymentEvents,
    ModelInstance,
    NoFitDetails,
    VramEstimate,
    answers,
)
from cohabit.service.control import admission as service
from cohabit.service.control.loadphases import LOADING_STATUSES, LoadProgress, current_load
from cohabit.service.errors import NotFound
from cohabit.store import copyset, events
from cohabit.store import deployments as store
from cohabit.store.database import Database, utcnow
from cohabit.store.records import (
    ACTIVE,
    MAX_COPIES,
    DeploymentRecord,
    DeploymentStatus,
    Scaling,
)
from cohabit.units import gib_ceil

UNAVAILABLE = "unavailable"  # estimation_source when nothing could be estimated

router = APIRouter(
    prefix="/serving", tags=["serving"], dependencies=[Authorized], responses=GUARDED
)
health_router = APIRouter(prefix="/serving", tags=["serving"], responses=answers(403))
NOT_FOUND = answers(404)


def _deploy_request(body: CreateModelDeployment) -> service.DeployRequest:
    return service.DeployRequest(
        model_id=str(body.m_id),
        config_id=None if body.m_config_id is None else str(body.m_config_id),
        file_id=None if body.m_file_id is None else str(body.m_file_id),
        engine_name=body.engine_name,
        vram_allocation=body.vram_allocation,
        force_cpu=body.force_cpu,
        body=body.model_dump(mode="json", by_alias=True),
        scaling=Scaling(
            priority=body.priority,
            keep_alive_s=body.keep_alive,
            queue=body.queue,
            min_copies=body.min_copies,
            starting_copies=body.starting_copies,
            max_copies=body.max_copies,
            duration_min=body.duration,
        ),
    )


@router.post(
    "/deploy_model",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=UUID,
    responses=answers(400, 404, 409),
    dependencies=[AdminOnly],
)
def deploy_model(body: CreateModelDeployment, context: Context) -> UUID:
    """Record the deployment and answer its id at once; the reconciler places and starts it.
    409 with the structured NoFit when it could not fit even on an empty fleet."""
    record = service.admit(context.db, _deploy_request(body))
    context.reconciler.wake()
    return UUID(record.id)


@router.post("/estimate_model_vram", response_model=VramEstimate, responses=answers(400))
def estimate_model_vram(body: CreateModelDeployment, context: Context) -> dict[str, Any]:
    """The estimate, or, when the model, config or file it names is not here, the reference's
    answer for that (a dict, not an error): `estimation_source` "unavailable", a zero
    estimate (the reference's gate skips a zero), and `detail` naming what is missing."""
    try:
        return service.estimate_vram(context.db, _deploy_request(body))
    except NotFound as err:
        return {
            "computed_vram_estimate": 0.0,
            "highest_node_vram": float(service.highest_device_bytes(context.db)),
            "estimation_source": UNAVAILABLE,
            "estimate": None,
            "detail": f"no estimate: {err}",
        }


@router.get("/deployments", response_model=list[Deployment])
async def list_deployments(
    request: Request,
    context: Context,
    model_id: UUID | None = None,
    limit: Limit = DEPLOYMENTS_LIMIT,
    offset: Offset = 0,
) -> Response:
    """Active deployments first (oldest first), then ended ones, newest first (api/paging.py)."""
    content = _PAGES.page(
        context.db,
        root_url=_root_url(request),
        limit=limit,
        offset=offset,
        model_id=None if model_id is None else str(model_id),
    )
    return Response(content, media_type="application/json")


@router.get("/deployment/{deployment_id}", response_model=Deployment, responses=NOT_FOUND)
def get_deployment(deployment_id: UUID, request: Request, context: Context) -> Deployment:
    copies = deployment_copies(context, deployment_id)
    loading = current_load(context.db, copies[0], utcnow())
    return deployment_view(copies[0], copies=copies, root_url=_root_url(request), loading=loading)


def deployment_copies(context: Context, deployment_id: UUID) -> list[DeploymentRecord]:
    """The deployment's rows, copy 0 first. NotFound for an unknown id, and for a copy's own
    id, naming the deployment it is a copy of."""
    record = service.get(context.db, str(deployment_id))
    if record.copy_of is not None:
        raise NotFound(
            f"{record.id} is copy {record.copy_index} of deployment {record.copy_of}, not a "
            f"deployment: GET /serving/deployment/{record.copy_of} (its instances list every copy)"
        )
    return store.copies_of(context.db, record.id) or [record]


def _root_url(request: Request) -> str:
    """The server's root as the caller reached it (the gateway lives there, beside /api)."""
    return str(request.base_url).rstrip("/")


@router.get("/deployment/{deployment_id}/status", response_model=str, responses=NOT_FOUND)
def get_deployment_status(deployment_id: UUID, context: Context) -> str:
    return copyset.status_of(deployment_copies(context, deployment_id)).value


@router.delete(
    "/deployment/{deployment_id}",
    response_model=bool,
    responses=NOT_FOUND,
    dependencies=[AdminOnly],
)
def stop_deployment(
    deployment_id: UUID, context: Context, caller: Caller, force: Annotated[bool, Query()] = False
) -> bool:
    """Stop it, every copy, and release its budget; false when it had already ended. A
    copy's own id is a 404 naming its deployment (copies stop with it). `force` is accepted
    for compatibility: stopping never waits on the engine."""
    del force
    deployment_copies(context, deployment_id)
    stopped = service.stop(context.db, context.runtime, str(deployment_id), by=caller.name)
    context.reconciler.wake()
    return stopped


LogTail = Annotated[int, Query(ge=1, le=10_000, description="How many last lines.")]
CopyIndex = Annotated[
    int, Query(ge=0, le=MAX_COPIES, description="Which copy's engine (0: the deployment's own).")
]


def copy_record(context: Context, deployment_id: UUID, copy: int) -> DeploymentRecord:
    """Copy `copy` of the deployment (0: its own row); NotFound when it has no such copy."""
    for record in deployment_copies(context, deployment_id):
        if record.copy_index == copy:
            return record
    raise NotFound(f"deployment {deployment_id} has no copy {copy}")


@router.get(
    "/deployment/{deployment_id}/logs", response_model=ContainerLogResponse, responses=NOT_FOUND
)
def get_deployment_logs(
    deployment_id: UUID, context: Context, tail: LogTail = TAIL_LINES, copy: CopyIndex = 0
) -> ContainerLogResponse:
    """The engine's log tail (the current run, reaching into the previous file if short) of
    copy `copy` (default: the deployment's own engine)."""
    record = copy_record(context, deployment_id, copy)
    handle = handle_from_json(record.engine_handle)
    lines = service.engine_logs(context.runtime, handle, tail=tail)
    return ContainerLogResponse(
        deployment_id=deployment_id,
        engine_type=record.engine,
        container_id=None if handle is None or handle.pid is None else str(handle.pid),
        log_file_path=(handle.log_path if handle else None) or "",
        logs=lines,
        total_lines_seen=len(lines),
        current_lines_stored=len(lines),
        capture_active=record.status in ACTIVE,
    )


@router.get(
    "/deployment/{deployment_id}/logs/patterns",
    response_model=ContainerLogPatternResponse,
    responses=NOT_FOUND,
)
def get_deployment_log_patterns(
    deployment_id: UUID, context: Context, tail: LogTail = TAIL_LINES, copy: CopyIndex = 0
) -> ContainerLogPatternResponse:
    """Which failure patterns (OOM, CUDA_ERROR, …) copy `copy`'s log tail shows, and the
    lines."""
    record = copy_record(context, deployment_id, copy)
    handle = handle_from_json(record.engine_handle)
    analysis = analyze_log(service.engine_logs(context.runtime, handle, tail=tail))
    return ContainerLogPatternResponse(
        deployment_id=deployment_id,
        patterns_detected=analysis.patterns_detected,
        analysis_timestamp=datetime.now(UTC),
        failure_lines=analysis.failure_lines,
    )


EventCursor = Annotated[
    int, Query(ge=0, le=2**63 - 1, description="Only events with an id above this one.")
]
EventLimit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description="How many events at most (1-1000).")
]


@router.get(
    "/deployment/{deployment_id}/events", response_model=DeploymentEvents, responses=NOT_FOUND
)
def get_deployment_events(
    deployment_id: UUID, context: Context, after: EventCursor = 0, limit: EventLimit = events.PAGE
) -> DeploymentEvents:
    """The deployment's timeline, oldest first, from the event after `after`; a follower
    passes the answer's `cursor` as its next `after`. The status is read before the events,
    so an `ended` answer already holds every step but, at most, the last one."""
    copies = deployment_copies(context, deployment_id)
    status = copyset.status_of(copies)
    page = events.since(context.db, copies[0].id, after=after, limit=limit)
    return DeploymentEvents(
        deployment_id=deployment_id,
        status=status.value,
        ended=status not in ACTIVE,
        events=[_event_view(event) for event in page],
        cursor=page[-1].id if page else after,
    )


def _event_view(event: events.EventRecord) -> DeploymentEvent:
    data = None if event.data is None else dict(event.data)
    return DeploymentEvent(
        id=event.id, at=event.at, kind=event.kind, message=event.message, data=data
    )


@router.get("/model_instances", response_model=list[ModelInstance], responses=NOT_FOUND)
def list_model_instances(
    context: Context, deployment_id: UUID | None = None
) -> list[ModelInstance]:
    """One instance per copy with a started engine, copies of a deployment together."""
    if deployment_id is not None:
        copies = deployment_copies(context, deployment_id)
    else:  # ended ones run no instance; every active copy is listed
        copies = [c for group in copyset.by_deployment(store.list_active(context.db)).values()
                  for c in group]  # fmt: skip
    return instances_of(copies)


@router.get("/model_instance/{instance_id}", response_model=ModelInstance, responses=NOT_FOUND)
def get_model_instance(instance_id: UUID, context: Context) -> ModelInstance:
    """An instance by id; instances exist while their copy is active."""
    for instance in instances_of(store.list_active(context.db)):
        if instance.id == instance_id:
            return instance
    raise NotFound(f"model instance {instance_id} not found (instances end with their copy)")


@router.get("/logs/{engine_type}", response_model=ContainerLogListResponse, responses=NOT_FOUND)
def list_engine_logs(engine_type: str, context: Context) -> ContainerLogListResponse:
    """The log files of every deployment an engine (`llamacpp`, `vllm`, `mlx`) ran, one per
    copy, newest first; read one with /serving/deployment/{id}/logs?copy={copy_index}."""
    if engine_type not in ENGINES:
        raise NotFound(f"no engine {engine_type!r} (engines: {', '.join(ENGINES)})")
    entries: list[dict[str, str]] = []
    for record in reversed(store.list_all(context.db, copies=True)):
        handle = handle_from_json(record.engine_handle)
        if record.engine != engine_type or handle is None or not handle.log_path:
            continue
        entries.append(
            {
                "deployment_id": record.deployment_id,
                "copy_index": str(record.copy_index),
                "m_name": record.model_name,
                "status": record.status.value,
                "log_file_path": handle.log_path,
                "container_id": "" if handle.pid is None else str(handle.pid),
                "requested_at": record.requested_at.isoformat(),
            }
        )
    return ContainerLogListResponse(engine_type=engine_type, logs=entries)


@router.get("/status")
def serving_status(context: Context) -> dict[str, str]:
    """Whether the serving runtime (here: the reconciler) is up — Ray's status upstream."""
    return {"status": "running" if context.reconciler.running else "not running"}


@health_router.get("/health")
def health(context: Context) -> list[dict[str, str]]:
    """Open without a token: the API, the database and the reconciler, one entry each. The
    database is "failing" while its last failed write has no successful one after it, the
    reconciler while its passes raise; each with the fault as `reason` and `since`."""
    database, reconciler = context.db.health(), context.reconciler.health()
    return [
        {"component": "api", "status": "ok"},
        _health_entry("database", database.status, database.reason, database.since),
        _health_entry("reconciler", reconciler.status, reconciler.reason, reconciler.since),
    ]


def _health_entry(
    component: str, status: str, reason: str | None, since: datetime | None
) -> dict[str, str]:
    """One component's entry: its status, and the fault and since when, when it has one."""
    entry = {"component": component, "status": status}
    if reason is not None:
        entry["reason"] = reason
    if since is not None:
        entry["since"] = since.isoformat()
    return entry


def instances_of(copies: Iterable[DeploymentRecord]) -> list[ModelInstance]:
    """An instance per copy while it has a started engine (in the order of `copies`)."""
    return [instance for copy in copies if (instance := _instance(copy)) is not None]


def _instance(copy: DeploymentRecord) -> ModelInstance | None:
    """The reference's instance of one copy's engine, its id derived from the copy's; beyond
    the reference's fields, `extra_details` says which copy it is, where it runs and its
    engine's root URL."""
    handle = handle_from_json(copy.engine_handle)
    if handle is None or copy.status not in ACTIVE:
        return None
    placement = copy.placement
    details: dict[str, Any] = {"copy_index": copy.copy_index, "copy_status": copy.status.value}
    if placement is not None:
        details |= {
            "gpu_indices": list(placement.gpu_indices),
            "partition": placement.partition,
            "allocated_bytes": placement.allocated_bytes,
        }
    if handle.base_url:
        details["base_url"] = handle.base_url
    if copy.memory_used_bytes is not None:
        details["memory_used_bytes"] = copy.memory_used_bytes
    return ModelInstance(
        id=uuid.uuid5(uuid.NAMESPACE_URL, f"cohabit:instance:{copy.id}"),
        deployment_id=UUID(copy.deployment_id),
        deployed_at=copy.deployed_at or copy.requested_at,
        container_id=None if handle.pid is None else str(handle.pid),
        node_id=fleet_ids.node_id(placement.node_name) if placement else None,
        host_name=placement.node_name if placement else None,
        listen_port=handle.port,
        status="DEPLOYED" if copy.status is DeploymentStatus.DEPLOYED else "REQUESTED",
        extra_details=details,
    )


def sub_mode(record: DeploymentRecord) -> str | None:
    """The reference's "TP-2 sub-mode": `macos_hybrid` for engines run natively on an
    Apple host, `linux_native` for a tensor-parallel engine elsewhere, None on one device."""
    placement = record.placement
    if placement is None:
        return None
    if placement.sharing_class == "metal_spawner" or placement.gpu_vendor == "apple":
        return "macos_hybrid"
    return "linux_native" if record.tensor_parallel > 1 else None


def spawner_process(record: DeploymentRecord) -> dict[str, Any] | None:
    """`{pid, rss_bytes, started_at, healthy}` of an engine this host runs as a local
    process (with its workers' memory); None when it runs elsewhere or has ended."""
    handle = handle_from_json(record.engine_handle)
    if handle is None or handle.pid is None or record.status not in ACTIVE:
        return None
    facts = process_facts(handle.pid)
    if facts is None:
        return None
    return {
        "pid": facts.pid,
        "rss_bytes": facts.rss_bytes,
        "started_at": datetime.fromtimestamp(facts.started_at, UTC),
        "healthy": record.status is DeploymentStatus.DEPLOYED,
    }


_PROBE_STATE = {
    DeploymentStatus.DEPLOYING: "pending",
    DeploymentStatus.INITIALIZING: "pending",
    DeploymentStatus.DEPLOYED: "passing",
    DeploymentStatus.ERROR: "failing",
    DeploymentStatus.FAILED: "failing",
}


def health_details(record: DeploymentRecord) -> dict[str, Any]:
    """The reference's health object: the readiness probe's state, the failure pattern the
    engine's log matched (the error code and its line), restarts (0: not counted here; a
    failed engine ends its deployment, but for a copy's beside a serving copy, whose new
    starts are `restarted` events), the placement's notices, and, once the meter has sampled
    the engine, its memory against its budget."""
    failed = record.last_error_code is not None
    details = {
        "probes": {"readiness": _PROBE_STATE.get(record.status)},
        "patterns": (
            {"code": record.last_error_code, "line": record.last_error_message} if failed else {}
        ),
        "restarts": 0,
        "notices": [] if record.placement is None else list(record.placement.notices),
    }
    memory = memory_details(record)
    if memory is not None:  # once the meter has sampled its engine
        details["memory"] = memory
    return details


def memory_details(record: DeploymentRecord) -> dict[str, Any] | None:
    """The meter's last sample against the budget; `over_budget_since` is set while the
    engine is above its budget (plus the server's tolerance). None before a sample."""
    if record.memory_sampled_at is None or record.memory_used_bytes is None:
        return None
    placement = record.placement
    devices = max(1, len(placement.gpu_indices)) if placement is not None else 1
    return {
        "used_bytes": record.memory_used_bytes,
        "budget_bytes": None if placement is None else placement.allocated_bytes * devices,
        "sampled_at": record.memory_sampled_at,
        "over_budget": record.over_budget_since is not None,
        "over_budget_since": record.over_budget_since,
    }


def _deployment_json(
    db: Database, record: DeploymentRecord, copies: Sequence[DeploymentRecord], root_url: str
) -> bytes:
    """`copies`: its active copies beyond copy 0."""
    loading = current_load(db, record, utcnow())
    view = deployment_view(record, copies=[record, *copies], root_url=root_url, loading=loading)
    return view.model_dump_json(by_alias=True).encode()


# A loading deployment's JSON changes as its load goes on: it is made afresh each time.
_PAGES = DeploymentPages(_deployment_json, live=lambda record: record.status in LOADING_STATUSES)


def deployment_view(
    record: DeploymentRecord,
    *,
    copies: Sequence[DeploymentRecord] = (),
    root_url: str | None = None,
    loading: LoadProgress | None = None,
) -> Deployment:
    """The deployment `record` (copy 0) as the API shows it, with its `copies` (its rows as
    `store.deployments.copies_of` reads them, copy 0 first; none given: it has no other).
    `root_url` (the server's, as the caller reached it) makes `endpoint` a full URL;
    `loading`, the progress of its load (loadphases.current_load), is shown as given. The
    placement, error and engine fields are copy 0's; the status and instances all copies'."""
    copies = copies or (record,)
    status = copyset.status_of(copies)
    placement = record.placement
    fields: dict[str, Any] = dict(record.request)
    path = paths.access_path(record.id)
    fields |= {
        "id": record.id,
        "access_path": path,
        "endpoint": None if root_url is None else f"{root_url}{path}/v1",
        "m_id": record.model_id,
        "m_config_id": record.config_id,
        "m_file_id": record.file_id,
        "engine_name": record.engine,
        "m_name": record.model_name,
        "status": status.value,
        "requested_at": record.requested_at,
        "deployed_at": record.deployed_at,
        "stopped_at": record.stopped_at,
        "last_error_code": record.last_error_code,
        "last_error_message": record.last_error_message,
        "last_error_at": record.last_error_at,
        "instances": instances_of(copies),
        "copies": len(copyset.active(copies)),
        "ready_copies": len(copyset.serving(copies)),
        "requested_bytes": record.requested_bytes,
        "tensor_parallel_size": record.tensor_parallel,
        "estimate": record.estimate,
        "no_fit": None if record.no_fit is None else NoFitDetails(**record.no_fit),
        "spawner_process": spawner_process(record),
        "health_details": health_details(record),
        **_scaling_fields(record.scaling),
        "last_used_at": record.last_used_at,
        "memory_used_bytes": record.memory_used_bytes,
        "memory_sampled_at": record.memory_sampled_at,
        "loading": None if loading is None else loading.to_dict(),
    }
    if placement is not None:
        total = placement.device_total_bytes
        # The stored placement is the public fields as they are (Placement.record_fields).
        fields |= asdict(placement) | {
            "allocated_capacity_gb": gib_ceil(placement.allocated_bytes),
            # vLLM's own knob; other engines have no such fraction
            "gpu_memory_utilization": (
                round(placement.allocated_bytes / total, 4)
                if total and record.engine == "vllm"
                else None
            ),
            "sub_mode": sub_mode(record),
        }
    return Deployment.model_validate(fields)


def _scaling_fields(scaling: Scaling) -> dict[str, Any]:
    """The scaling fields as admitted (the columns, not the stored body: rows from before
    the columns existed show what they ran with)."""
    return {
        "priority": scaling.priority,
        "keep_alive": scaling.keep_alive_s,
        "queue": scaling.queue,
        "min_copies": scaling.min_copies,
        "starting_copies": scaling.starting_copies,
        "max_copies": scaling.max_copies,
        "duration": scaling.duration_min,
        "ends_at": scaling.ends_at,
    }
