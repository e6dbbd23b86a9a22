"""The fix shown on the web page's details view for the error code a deployment carries; the
table lives in `runtime.fixes`, with placement's hints for a NoFit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cohabit.runtime.fixes import fix_for as _fix_for


def fix_for(code: str | None, no_fit: Mapping[str, Any] | None = None) -> str | None:
    """The fix for `last_error_code` (for a NoFitError, for the reason in `no_fit`); None for
    no code or one we have no advice for."""
    return _fix_for(code, (no_fit or {}).get("reason"))
