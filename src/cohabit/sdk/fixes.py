"""What to do about a failed deployment: the one table of fixes per `last_error_code`, from the
deployment docs (docs/api.md, the anchor's "Model Deployment" page). NoFit reasons take their
fix from placement's own hints. `DeploymentFailedError.fix` and `cohabit deploy` read it.
"""

from __future__ import annotations

from collections.abc import Mapping

from cohabit.placement.reasons import HINTS, NoFitReason

NO_FIT_CODE = "NoFitError"

RUNTIME_FIXES: Mapping[str, str] = {
    "OOM": (
        "reduce the context length (--max-model-len), pick a smaller or more quantized "
        "variant, or reserve more (--vram); memory used outside cohabit is not counted"
    ),
    "CUDA_ERROR": (
        "check the GPU driver and that the engine can see the GPU (nvidia-smi); "
        "restart GPU services or the host"
    ),
    "MODEL_LOADING_FAILURE": (
        "check that the model files exist, are readable and suit the engine version; "
        "download them again if in doubt"
    ),
    "CONTAINER_EXITED": (
        "the engine exited: read its log (cohabit logs ID) for memory limits, flags or drivers"
    ),
    "RUNTIME_ERROR": "read the engine's log (cohabit logs ID); retry as is if it was transient",
    "STARTUP_TIMEOUT": (
        "the engine was not ready in time: use a smaller model or a shorter context, "
        "or raise the server's start-up timeout"
    ),
    "MUST_REDOWNLOAD": "the model's files are missing or corrupt: download them again, then retry",
}


def fix_for(code: str | None, message: str | None = None) -> str | None:
    """The suggested fix for an error code; for `NoFitError` the reason is the message's
    first word (`insufficient_capacity: 0/1 nodes fit: …`). None for unknown codes."""
    if code is None:
        return None
    if code == NO_FIT_CODE:
        reason = (message or "").partition(":")[0].strip()
        try:
            return HINTS[NoFitReason(reason)]
        except ValueError:
            return "free budget (stop a deployment) or ask for less memory"
    return RUNTIME_FIXES.get(code)
