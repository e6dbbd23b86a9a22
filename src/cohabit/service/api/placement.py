"""/api/placement/plan: a dry run of deploy_model — the estimate, and where the deployment
would land on the fleet as it is now, or the structured NoFit. Nothing is recorded or
reserved. The web page's deploy form calls `dry_run` through this route's twin in `ui/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from cohabit.placement.decision import Placement
from cohabit.placement.planner import plan
from cohabit.placement.reasons import NoFit
from cohabit.service.api.deps import Authorized, Context
from cohabit.service.api.schemas import GUARDED, CreateModelDeployment, answers
from cohabit.service.api.serving import _deploy_request as deploy_request
from cohabit.service.control import admission as service
from cohabit.service.control.failures import no_fit_body
from cohabit.store import ledger
from cohabit.store.database import Database
from cohabit.units import gib_ceil, gib_floor

router = APIRouter(
    prefix="/placement", tags=["placement"], dependencies=[Authorized], responses=GUARDED
)


class PlanPreview(BaseModel):
    """The answer: the sizing (as estimate_model_vram gives it) and `placement` (the plan's
    fields plus where, and the free budget left there) or `no_fit` (as the 409 carries it)."""

    model_name: str
    m_config_id: str
    engine_name: str
    tensor_parallel_size: int
    max_model_len: int | None
    requested_bytes: int
    requested_capacity_gb: int
    estimation_source: str
    estimate: dict[str, Any] | None
    fits: bool
    placement: dict[str, Any] | None
    no_fit: dict[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DryRun:
    """What deploying would do now: the sizing, and the planner's decision against the
    ledger's current state (`free_bytes` per slot position, before this placement)."""

    sizing: service.Sizing
    decision: Placement | NoFit
    topology: str
    free_bytes: tuple[int, ...]


def dry_run(db: Database, request: service.DeployRequest) -> DryRun:
    """Size the request as admission does and plan it against the reservations held now.

    Raises NotFound / InvalidInput as `deployments.size` does."""
    sizing = service.size(db, request)
    wanted = service.placement_request(
        "dry-run",
        requested_bytes=sizing.requested_bytes,
        tensor_parallel=sizing.settings.tensor_parallel,
        engine=sizing.engine,
        force_cpu=request.force_cpu,
    )
    state = ledger.current_state(db)
    return DryRun(
        sizing=sizing,
        decision=plan(state, wanted),
        topology=state.fleet.topology.value,
        free_bytes=tuple(state.free_bytes()),
    )


@router.post("/plan", response_model=PlanPreview, responses=answers(400, 404))
def plan_deployment(body: CreateModelDeployment, context: Context) -> PlanPreview:
    """The same body as deploy_model; answers `placement` or `no_fit`, never both."""
    return preview_view(dry_run(context.db, deploy_request(body)))


def preview_view(result: DryRun) -> PlanPreview:
    sizing = result.sizing
    placement: dict[str, Any] | None = None
    no_fit: dict[str, Any] | None = None
    if isinstance(result.decision, Placement):
        chosen = result.decision
        free_now = min(result.free_bytes[a.slot.position] for a in chosen.allocations)
        placement = chosen.fields() | {
            "topology": result.topology,
            "location": ", ".join(a.slot.location for a in chosen.allocations),
            "gpu_vendor": chosen.gpu_vendor.value,
            "device_total_bytes": chosen.first.total_bytes,
            "free_bytes_before": free_now,
            "free_bytes_after": max(0, free_now - chosen.allocated_bytes),
            "free_gb_after": gib_floor(max(0, free_now - chosen.allocated_bytes)),
        }
    else:
        no_fit = no_fit_body(result.decision, result.topology)
    return PlanPreview(
        model_name=sizing.model.name,
        m_config_id=sizing.config.id,
        engine_name=sizing.engine,
        tensor_parallel_size=sizing.settings.tensor_parallel,
        max_model_len=sizing.max_model_len,
        requested_bytes=sizing.requested_bytes,
        requested_capacity_gb=gib_ceil(sizing.requested_bytes),
        estimation_source=sizing.source,
        estimate=None if sizing.estimate is None else sizing.estimate.to_dict(),
        fits=placement is not None,
        placement=placement,
        no_fit=no_fit,
    )
