"""What to do about a failed deployment: the one table of fixes per runtime error code, from
the troubleshooting guide, plus placement's own hints for a NoFit. The SDK
(`DeploymentFailedError.fix`, `cohabit deploy`) and the web page's details view read it."""

from __future__ import annotations

from collections.abc import Mapping

from cohabit.placement.reasons import HINTS, NoFitReason
from cohabit.runtime.interface import RuntimeErrorCode

NO_FIT_CODE = "NoFitError"

RUNTIME_FIXES: Mapping[str, str] = {
    RuntimeErrorCode.OOM.value: (
        "reduce the context length, pick a smaller or more quantized variant, or reserve more "
        "memory; budgets are reservations, not meters, so memory used outside cohabit on the "
        "device or host is not counted — free it, then deploy again"
    ),
    RuntimeErrorCode.CUDA_ERROR.value: (
        "check that the GPU driver is loaded and the engine can see the device "
        "(nvidia-smi / rocm-smi); the error is worth a retry as is"
    ),
    RuntimeErrorCode.MODEL_LOADING_FAILURE.value: (
        "the engine could not load the model's files (the message names the file): check they "
        "exist, are readable and suit the engine version, or download the model again"
    ),
    RuntimeErrorCode.CONTAINER_EXITED.value: (
        "the engine exited: read its log (memory limits, flags, drivers), then deploy again"
    ),
    RuntimeErrorCode.RUNTIME_ERROR.value: (
        "read the message and the engine's log; retry as is if it was transient"
    ),
    RuntimeErrorCode.STARTUP_TIMEOUT.value: (
        "the engine was not ready in time: large models (on unified memory especially) load "
        "slowly — check its log, use a smaller model or a shorter context, or raise the "
        "server's start-up timeout (--startup-timeout)"
    ),
    RuntimeErrorCode.MUST_REDOWNLOAD.value: (
        "the model's files are missing or corrupt on disk: download them again, then retry"
    ),
}


def fix_for(code: str | None, reason: str | None = None) -> str | None:
    """The fix for a `last_error_code`; for `NoFitError`, the hint for its `reason`. None for
    no code, or a code or reason we have no advice for."""
    if code is None:
        return None
    if code == NO_FIT_CODE:
        try:
            return HINTS[NoFitReason(str(reason))]
        except ValueError:
            return None
    return RUNTIME_FIXES.get(code)
