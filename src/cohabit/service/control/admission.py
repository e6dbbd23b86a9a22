"""Admission and the other deployment verbs the serving router calls: resolve the model and
config, estimate the bytes per device, refuse what can never fit, record the deployment
(REQUESTED) for the reconciler; estimate without deploying; stop.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cohabit.estimate import (
    EngineSettings,
    Estimate,
    EstimateError,
    InvalidSetting,
    estimate_model,
)
from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.estimate import ENGINES
from cohabit.hardware.model import Fleet, Vendor
from cohabit.placement.copies import CopiesNoFit, plan_copies
from cohabit.placement.errors import InvalidRequest
from cohabit.placement.planner import never_fits
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import FleetState
from cohabit.runtime.errors import fault_text
from cohabit.runtime.interface import EngineHandle, EngineRuntime, handle_from_json
from cohabit.service.control import timeline
from cohabit.service.control.failures import no_fit_body
from cohabit.service.errors import InvalidInput, NeverFits, NotFound, found
from cohabit.store import catalog, copies, deployments, ledger
from cohabit.store.database import Database
from cohabit.store.records import (
    DeploymentRecord,
    ModelConfigRecord,
    ModelRecord,
    NewDeployment,
    Scaling,
)
from cohabit.units import gib_ceil

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeployRequest:
    """The parts of a CreateModelDeployment body that decide what is run and how big it is;
    `body` is the whole body, kept on the record."""

    model_id: str
    config_id: str | None
    file_id: str | None
    engine_name: str | None
    vram_allocation: float | None
    force_cpu: bool
    body: Mapping[str, Any]
    scaling: Scaling = field(default_factory=Scaling)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sizing:
    """What admission worked out: the model, the engine and the bytes per device."""

    model: ModelRecord
    config: ModelConfigRecord
    file_id: str | None
    model_path: str | None
    engine: str
    requested_bytes: int
    settings: EngineSettings
    estimate: Estimate | None
    source: str  # "override" (vram_allocation) or the weights' source: exact | derived

    @property
    def max_model_len(self) -> int | None:
        """The context sized for: the estimate's (the model's own when none was set)."""
        if self.estimate is not None:
            return self.estimate.max_model_len
        return self.settings.max_model_len


def size(db: Database, request: DeployRequest) -> Sizing:
    """Resolve and estimate. Raises NotFound for unknown ids, InvalidInput for the rest."""
    model = found(lambda: catalog.get_model(db, request.model_id))
    if request.config_id is None:
        configs = catalog.list_configs(db, model_id=model.id)
        if not configs:
            raise InvalidInput(f"model {model.id} has no configs; create one first")
        config = next((c for c in configs if c.default), configs[0])
    else:
        config = found(lambda: catalog.get_config(db, str(request.config_id)))
        if config.model_id != model.id:
            raise InvalidInput(f"model config {config.id} belongs to another model")
    file_id = request.file_id or config.file_id
    model_path = model.model_path
    if file_id is not None:
        chosen = next((f for f in model.files if f.id == file_id), None)
        if chosen is None:
            raise NotFound(f"model file {file_id} not found for model {model.id}")
        if model.format == "gguf" and chosen.storage_location:
            model_path = chosen.storage_location
    engine = request.engine_name or str(config.config.get("engine") or "")
    engine = engine or ("llamacpp" if model.format == "gguf" else "vllm")
    if engine not in ENGINES:
        raise InvalidInput(f"unknown engine_name {engine!r} (use {', '.join(ENGINES)})")
    try:
        settings = EngineSettings.from_config(config.config, where=f"model config {config.id}")
    except InvalidSetting as err:
        raise InvalidInput(str(err)) from None
    if engine == "llamacpp" and settings.kv_cache_dtype != "auto":
        # The llama.cpp launcher passes no cache type: sizing one would not be what runs.
        raise InvalidInput(
            f"model config {config.id}: kv_cache_dtype {settings.kv_cache_dtype!r} is not "
            "passed to llama.cpp, which runs with its default f16 KV cache; remove it"
        )
    override = request.vram_allocation
    estimate: Estimate | None = None
    if override is not None and override >= 1:
        # The caller sized it (kamiwaza's escape hatch for unprofiled models): trust it, and
        # skip reading the model's files on the request path.
        requested, source = int(override), "override"
    elif _files_gone(model_path, model):
        # Deleted since registration: admit on the sizes the catalog recorded, so the launch
        # ends in MUST_REDOWNLOAD (what to do) rather than the request in "cannot estimate".
        requested, source = sum(f.size_bytes or 0 for f in model.files), "recorded"
    else:
        try:
            source_path = model_path or model.repo_id or model.source
            estimate = estimate_model(source_path, engine=engine, settings=settings)
        except EstimateError as err:
            raise InvalidInput(f"cannot estimate {model.name} on {engine}: {err}") from None
        requested = estimate.total_bytes
        source = str(estimate.sources.get("weights_bytes", "derived"))
    return Sizing(
        model=model,
        config=config,
        file_id=file_id,
        model_path=model_path,
        engine=engine,
        requested_bytes=requested,
        settings=settings,
        estimate=estimate,
        source=source,
    )


def check_config(db: Database, model_id: str, config: Mapping[str, Any]) -> None:
    """Refuse, before a model config is stored, a `max_model_len` over the model's own context,
    which `size` would refuse at every deploy (the estimator's check; llama.cpp runs past it,
    so is let through). Settings that do not parse and a model whose files cannot be read now
    are left to `size`. Raises NotFound (unknown model) or InvalidInput naming the field."""
    model = found(lambda: catalog.get_model(db, model_id))
    try:
        wanted = EngineSettings.from_config(config, where="config").max_model_len
    except InvalidSetting:
        return  # `size` refuses it at deploy, naming the config
    engine = str(config.get("engine") or ("llamacpp" if model.format == "gguf" else "vllm"))
    if wanted is None or engine == "llamacpp" or _files_gone(model.model_path, model):
        return
    try:
        shape = load_shape(model.model_path or model.repo_id or model.source)
    except EstimateError:
        return
    if wanted > shape.max_model_len:
        raise InvalidInput(
            f"config.max_model_len: {wanted:,} tokens exceeds {model.name}'s own "
            f"{shape.max_model_len:,}",
            loc=("body", "config", "max_model_len"),
        )


def _files_gone(model_path: str | None, model: ModelRecord) -> bool:
    recorded = any(f.size_bytes for f in model.files)
    return model_path is not None and recorded and not Path(model_path).exists()


def placement_request(
    name: str, *, requested_bytes: int, tensor_parallel: int, engine: str, force_cpu: bool
) -> PlacementRequest:
    try:
        return PlacementRequest(
            name=name,
            vram_bytes=requested_bytes,
            tensor_parallel=tensor_parallel,
            vendor=Vendor.CPU if force_cpu else None,
            engine=engine,
        )
    except InvalidRequest as err:
        raise InvalidInput(str(err)) from None


def admit(db: Database, request: DeployRequest) -> DeploymentRecord:
    """Record a deployment the reconciler will place, or refuse it now (409) when it could
    not fit even if the fleet were empty."""
    sizing = size(db, request)
    deployment_id = str(uuid.uuid4())
    wanted = placement_request(
        deployment_id,
        requested_bytes=sizing.requested_bytes,
        tensor_parallel=sizing.settings.tensor_parallel,
        engine=sizing.engine,
        force_cpu=request.force_cpu,
    )
    fleet = ledger.current_state(db).fleet
    refusal = never_fits(fleet, wanted)
    if refusal is not None:
        body = no_fit_body(refusal, fleet.topology.value)
        raise NeverFits(f"{refusal.reason.value}: {refusal.message}", body)
    _copies_never_fit(fleet, wanted, request.scaling.starting_copies)
    new = NewDeployment(
        id=deployment_id,
        model_id=sizing.model.id,
        config_id=sizing.config.id,
        file_id=sizing.file_id,
        model_name=sizing.model.name,
        engine=sizing.engine,
        request=dict(request.body) | {"m_config_id": sizing.config.id},
        model_path=sizing.model_path,
        requested_bytes=sizing.requested_bytes,
        tensor_parallel=sizing.settings.tensor_parallel,
        max_model_len=sizing.max_model_len,
        engine_settings=sizing.settings.to_dict(),
        estimate=None if sizing.estimate is None else sizing.estimate.to_dict(),
        scaling=request.scaling,
    )
    # The model may be deleted after `size` read it: a 404 naming it, nothing recorded.
    return found(
        lambda: deployments.create(db, new, steps=[timeline.requested(new, source=sizing.source)])
    )


def _copies_never_fit(fleet: Fleet, wanted: PlacementRequest, copies: int) -> None:
    """Refuse (409) a deployment whose starting copies could not all fit even on the empty
    fleet, saying how many would."""
    if copies < 2:
        return
    names = [replace(wanted, name=f"{wanted.name}#{index}") for index in range(copies)]
    decision = plan_copies(FleetState(fleet=fleet), names)
    if isinstance(decision, CopiesNoFit):
        body = no_fit_body(decision.no_fit, fleet.topology.value)
        body |= {"message": decision.message, "copies_wanted": copies, "copies_fit": decision.fit}
        raise NeverFits(f"{decision.no_fit.reason.value}: {decision.message}", body)


def highest_device_bytes(db: Database) -> int:
    """What placement may use on the largest device (after any OS reserve), so that the
    reference gate "estimate > highest_node_vram" agrees with what placement refuses."""
    fleet = ledger.current_state(db).fleet
    return max((s.capacity_bytes for s in FleetState(fleet=fleet).slots), default=0)


def estimate_vram(db: Database, request: DeployRequest) -> dict[str, Any]:
    """`POST /serving/estimate_model_vram`: the bytes a deployment would reserve per device and
    the largest device's memory, plus our breakdown."""
    sizing = size(db, request)
    return {
        "computed_vram_estimate": float(sizing.requested_bytes),
        "highest_node_vram": float(highest_device_bytes(db)),
        "estimation_source": sizing.source,
        "engine_name": sizing.engine,
        "tensor_parallel_size": sizing.settings.tensor_parallel,
        "requested_bytes": sizing.requested_bytes,
        "requested_capacity_gb": gib_ceil(sizing.requested_bytes),
        "estimate": None if sizing.estimate is None else sizing.estimate.to_dict(),
    }


def stop(
    db: Database,
    runtime: EngineRuntime,
    deployment_id: str,
    *,
    by: str | None = None,
    reason: str | None = None,
) -> bool:
    """Stop a deployment: STOPPED and its budget released in one transaction, then its engine
    stopped here, before the answer, whoever drove it. The driver may have died (SIGKILL) with
    its lease still running, and then nobody else would: the runtime finds the engine by its
    recorded pid and checks its marks and start time, so a reused pid is never signalled (a
    live driver's own stop on its next pass finds nothing left). Without a recorded handle
    (its driver died right after starting it) the runtime looks the engine up by the id.
    False when the deployment had already ended. `by` names the caller on its timeline, or
    `reason` why the server stopped it. Every copy of the deployment stops with it."""
    found(lambda: deployments.get(db, deployment_id))
    # Every copy ends (and releases its budget) in one transaction, then their engines stop.
    ended = copies.end_all(db, deployment_id, values=deployments.stop_values())
    for before in ended:
        timeline.stopped(db, before, by=by, reason=reason)
    for before in ended:
        handle = handle_from_json(before.engine_handle) or EngineHandle(deployment_id=before.id)
        try:
            runtime.stop(handle)
        except Exception:  # the budget is released; a stuck engine is logged, not re-reserved
            log.exception("stopping the engine of deployment %s failed", before.id)
    return bool(ended)


def engine_logs(runtime: EngineRuntime, handle: EngineHandle | None, *, tail: int) -> list[str]:
    """The engine's log tail; a fault reading it (a file removed under us, a runtime that
    cannot reach the engine) becomes one line saying so, and touches nothing else."""
    if handle is None:
        return []
    try:
        return runtime.logs(handle, tail=tail)
    except Exception as err:
        log.exception("reading the logs of deployment %s failed", handle.deployment_id)
        return [f"(logs unavailable: {fault_text(err)})"]


def get(db: Database, deployment_id: str) -> DeploymentRecord:
    return found(lambda: deployments.get(db, deployment_id))
