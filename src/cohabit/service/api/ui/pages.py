"""The web page's routes: `/` (the page itself, open: it holds no data) and the fragments its
script polls and swaps in under `/ui/…` (each behind the API token, sent by the script).
Each route reads the store, builds a view (`views.py`) and renders a template."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from cohabit import __version__
from cohabit.estimate.estimate import ENGINES
from cohabit.hardware.slots import SlotKey
from cohabit.placement.state import FleetState
from cohabit.runtime.interface import handle_from_json
from cohabit.service.api.deps import AdminOnly, Authorized, Context
from cohabit.service.api.paging import DEPLOYMENTS_LIMIT
from cohabit.service.api.placement import dry_run, preview_view
from cohabit.service.api.schemas import CreateModelDeployment
from cohabit.service.api.serving import _deploy_request as deploy_request
from cohabit.service.api.serving import deployment_copies, deployment_view
from cohabit.service.api.ui import views
from cohabit.service.api.ui.contexts import config_for_context
from cohabit.service.control import admission as service
from cohabit.service.control.loadphases import current_load
from cohabit.service.errors import found
from cohabit.store import catalog, events, ledger
from cohabit.store import deployments as store
from cohabit.store.database import utcnow
from cohabit.store.deployments import Named

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
POLL_INTERVAL_MS = 2000
LOG_TAIL_LINES = 40
TIMELINE_EVENTS = 100  # the details show a long timeline's last steps (`cohabit events`: all)

templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals["size_text"] = views.size_text
templates.env.globals["spark_width"] = views.SPARK_WIDTH
templates.env.globals["spark_height"] = views.SPARK_HEIGHT
page_router = APIRouter(include_in_schema=False)
router = APIRouter(prefix="/ui", include_in_schema=False, dependencies=[Authorized])


class ContextConfig(BaseModel):
    """A context length for a model's config: the config with that `max_model_len`."""

    m_id: UUID
    m_config_id: UUID | None = None
    max_model_len: int = Field(ge=16, le=16_777_216)


@page_router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "index.html", {"version": __version__, "poll_ms": POLL_INTERVAL_MS}
    )


@router.get("/fleet", response_class=HTMLResponse)
def fleet(context: Context) -> HTMLResponse:
    """Drawn again only when the ledger state (the store hands back the same object while
    nothing changed) or a holder's name or status changed: every open page polls this."""
    state = ledger.current_state(context.db)
    holders = store.names(context.db, {r.deployment for r in state.reservations})
    measured = {d.key: (d.cohabit_bytes, d.foreign_bytes) for d in context.meter.latest().devices}
    drawn = _last_fleet
    if drawn is None or drawn[0] is not state or drawn[1] != holders or drawn[2] != measured:
        gpu_memory = {
            f"{node.name}/{gpu.index}": gpu.memory_bytes or 0
            for node in state.fleet.nodes
            for gpu in node.gpus
        }
        fleet_map = views.fleet_map(state, holders, gpu_memory, measured)
        html = templates.get_template("fleet.html").render(fleet=fleet_map)
        drawn = (state, holders, measured, html)
        _remember_fleet(drawn)
    return HTMLResponse(drawn[3])


# The last fleet drawn: the state, its holders and the measured figures it was drawn from.
_Drawn = tuple[FleetState, dict[str, Named], dict[SlotKey, tuple[int, int]], str]
_last_fleet: _Drawn | None = None


def _remember_fleet(drawn: _Drawn) -> None:
    global _last_fleet
    _last_fleet = drawn


@router.get("/deployments", response_class=HTMLResponse)
def deployments(request: Request, context: Context) -> HTMLResponse:
    now = utcnow()
    page = store.page(context.db, limit=DEPLOYMENTS_LIMIT)  # the API's default page
    records = sorted(page, key=lambda r: r.requested_at, reverse=True)
    copies = store.active_copies(context.db, [r.id for r in records])
    rows = [
        views.deployment_row(
            deployment_view(
                record,
                copies=[record, *(c for c, _ in copies.get(record.id, ()))],
                loading=current_load(context.db, record, now),
            ),
            now,
            [(p.used_bytes, p.budget_bytes) for p in context.meter.history(record.id)],
        )
        for record in records
    ]
    return templates.TemplateResponse(request, "deployments.html", {"rows": rows})


@router.get("/deployments/{deployment_id}", response_class=HTMLResponse)
def deployment(deployment_id: UUID, request: Request, context: Context) -> HTMLResponse:
    copies = deployment_copies(context, deployment_id)
    record = copies[0]
    handle = handle_from_json(record.engine_handle)
    logs = service.engine_logs(context.runtime, handle, tail=LOG_TAIL_LINES)
    now = utcnow()
    view = deployment_view(record, copies=copies, loading=current_load(context.db, record, now))
    shown = views.details(view, now, logs)
    steps = views.timeline(events.latest(context.db, record.id, limit=TIMELINE_EVENTS))
    return templates.TemplateResponse(request, "details.html", {"d": shown, "timeline": steps})


@router.get("/deploy-form", response_class=HTMLResponse)
def deploy_form(request: Request, context: Context) -> HTMLResponse:
    models = catalog.list_models(context.db)
    configs = catalog.list_configs(context.db)
    return templates.TemplateResponse(
        request, "deploy_form.html", {"models": models, "configs": configs, "engines": ENGINES}
    )


@router.post("/preview", response_class=HTMLResponse)
def preview(body: CreateModelDeployment, request: Request, context: Context) -> HTMLResponse:
    """The dry run drawn: the estimate breakdown and where it would land, or the NoFit."""
    shown = preview_view(dry_run(context.db, deploy_request(body)))
    parts = list(views.estimate_fields(shown.estimate)) if shown.estimate else []
    return templates.TemplateResponse(request, "preview.html", {"p": shown, "parts": parts})


@router.post("/context-config", dependencies=[AdminOnly])  # it may create a config
def context_config(body: ContextConfig, context: Context) -> dict[str, Any]:
    """The model's config with this context length (an existing one, or a new one copied
    from the chosen config), so the dry run and the deployment size the same thing."""
    found(lambda: catalog.get_model(context.db, str(body.m_id)))
    config = config_for_context(
        context.db,
        model_id=str(body.m_id),
        config_id=None if body.m_config_id is None else str(body.m_config_id),
        max_model_len=body.max_model_len,
    )
    return {"m_config_id": config.id, "name": config.name}
