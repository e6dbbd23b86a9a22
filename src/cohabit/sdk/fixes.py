"""The fix for a failed deployment as the SDK sees it: the code and the message the server
recorded (a NoFit message starts with its reason). The table lives in `runtime.fixes`."""

from __future__ import annotations

from cohabit.runtime.fixes import NO_FIT_CODE, RUNTIME_FIXES
from cohabit.runtime.fixes import fix_for as _fix_for

__all__ = ["NO_FIT_CODE", "RUNTIME_FIXES", "fix_for"]


def fix_for(code: str | None, message: str | None = None) -> str | None:
    """The suggested fix for an error code; for `NoFitError` the reason is the message's
    first word (`insufficient_capacity: 0/1 nodes fit: …`). None for unknown codes."""
    if code == NO_FIT_CODE:
        reason = (message or "").partition(":")[0].strip()
        return _fix_for(code, reason) or "free budget (stop a deployment) or ask for less memory"
    return _fix_for(code)
