"""The fix the troubleshooting guide gives for each error code a deployment can carry, shown
on the web page's details view. NoFit reasons take theirs from `placement.reasons.HINTS`,
the one place placement messages are written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cohabit.placement.reasons import HINTS, NoFitReason
from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.store.records import NO_FIT_ERROR

RUNTIME_FIXES: Mapping[RuntimeErrorCode, str] = {
    RuntimeErrorCode.OOM: (
        "budgets are reservations, not meters: something outside cohabit may have taken the "
        "memory. Free memory on the device or host, or reduce the model's footprint (a smaller "
        "or more quantized variant, a shorter context), then deploy again"
    ),
    RuntimeErrorCode.CUDA_ERROR: (
        "check that the driver is loaded and the device is visible (nvidia-smi / rocm-smi); "
        "the error is worth a retry as is"
    ),
    RuntimeErrorCode.MODEL_LOADING_FAILURE: (
        "the engine could not load the model's files: the message names the file; download "
        "the model again or pick a variant the engine supports"
    ),
    RuntimeErrorCode.CONTAINER_EXITED: (
        "the engine exited: read the log tail below for why, then deploy again"
    ),
    RuntimeErrorCode.RUNTIME_ERROR: (
        "read the exception in the message and the log tail; the error is worth a retry as is"
    ),
    RuntimeErrorCode.STARTUP_TIMEOUT: (
        "the engine did not answer in time; large models on unified memory can take a while "
        "on first load — check the log tail, then deploy again"
    ),
    RuntimeErrorCode.MUST_REDOWNLOAD: "the model's files are missing on disk: download it again",
}


def fix_for(code: str | None, no_fit: Mapping[str, Any] | None = None) -> str | None:
    """The fix for `last_error_code` (for a NoFitError, for the reason in `no_fit`); None for
    no code or one we have no advice for."""
    if code is None:
        return None
    if code == NO_FIT_ERROR:
        reason = (no_fit or {}).get("reason")
        try:
            return HINTS[NoFitReason(str(reason))]
        except ValueError:
            return None
    try:
        return RUNTIME_FIXES[RuntimeErrorCode(code)]
    except ValueError:
        return None
