"""What a deployment's end records: the status each engine failure code ends in, a runtime
failure's record (and what an engine's status means for its deployment), and a NoFit's
structured body (the 409 answer and the record carry the same)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from cohabit.placement.reasons import NoFit
from cohabit.runtime.interface import EngineState, EngineStatus, RuntimeErrorCode
from cohabit.store.records import NO_FIT_ERROR, DeploymentFailure, DeploymentStatus
from cohabit.units import gib_ceil, gib_floor

# ERROR is worth a retry as is; FAILED needs the user to change something (docs/api.md).
FAILURE_STATUS: dict[RuntimeErrorCode, DeploymentStatus] = {
    RuntimeErrorCode.OOM: DeploymentStatus.FAILED,
    RuntimeErrorCode.MODEL_LOADING_FAILURE: DeploymentStatus.FAILED,
    RuntimeErrorCode.STARTUP_TIMEOUT: DeploymentStatus.FAILED,
    RuntimeErrorCode.MUST_REDOWNLOAD: DeploymentStatus.MUST_REDOWNLOAD,
    RuntimeErrorCode.CUDA_ERROR: DeploymentStatus.ERROR,
    RuntimeErrorCode.CONTAINER_EXITED: DeploymentStatus.ERROR,
    RuntimeErrorCode.RUNTIME_ERROR: DeploymentStatus.ERROR,
}


def runtime_failure(
    code: RuntimeErrorCode,
    message: str,
    at: datetime | None = None,
    *,
    after_ready: bool = False,
) -> DeploymentFailure:
    """The failure a runtime code records. An engine that served and then died ends in ERROR
    whatever the code: it did start inside its budget, so the same deployment may run again
    (an OOM then usually means memory taken outside cohabit), while the same failure during
    start-up needs the user to change something (FAILED)."""
    status = FAILURE_STATUS[code]
    if after_ready and status is DeploymentStatus.FAILED:
        status = DeploymentStatus.ERROR
    return DeploymentFailure(status=status, code=code.value, message=message, at=at)


def engine_failure(engine: EngineStatus, *, served: bool) -> DeploymentFailure | None:
    """What an engine's status means for its deployment: None while it starts or serves;
    once it has stopped, the failure (its own code and line, else that it exited), in ERROR
    when it had `served` (see `runtime_failure`)."""
    if engine.state in (EngineState.READY, EngineState.STARTING):
        return None
    code = engine.error_code or RuntimeErrorCode.CONTAINER_EXITED
    message = engine.error_message or f"engine {engine.state.value}"
    return runtime_failure(code, message, engine.error_at, after_ready=served)


def no_fit_body(no_fit: NoFit, topology: str) -> dict[str, Any]:
    """The structured NoFit: the reason id, the sentence, the numbers (bytes, and GB for the
    fields named so), as the 409 answer and the deployment record carry it."""
    details = no_fit.details()
    # The reference body counts filtered candidates as one number; the per-filter counts
    # travel beside it.
    by_filter = details.pop("candidates_filtered")
    filtered = sum(by_filter.values())
    return {
        "error": "placement_no_fit",
        "reason": no_fit.reason.value,
        "message": no_fit.message,
        "topology": topology,
        "requested_capacity_gb": gib_ceil(no_fit.requested_bytes),
        "largest_available_capacity_gb": gib_floor(no_fit.largest_free_bytes),
        "largest_available_location": no_fit.largest_free_location,
        **details,
        "candidates_filtered": filtered,
        "candidates_filtered_by_filter": by_filter,
        "candidates_remaining": max(0, no_fit.candidates_considered - filtered),
    }


def no_fit_failure(decision: NoFit, topology: str) -> DeploymentFailure:
    """The failure a NoFit records (FAILED, `NoFitError`, the reason and the sentence)."""
    return DeploymentFailure(
        status=DeploymentStatus.FAILED,
        code=NO_FIT_ERROR,
        message=f"{decision.reason.value}: {decision.message}",
        no_fit=no_fit_body(decision, topology),
    )
