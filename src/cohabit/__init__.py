"""cohabit: estimate each LLM deployment's memory, reserve it on a GPU, MIG slice or memory
pool, and serve many models side by side without out-of-memory surprises.

`cohabit.Client`, `cohabit.AsyncClient` and the SDK's errors load on first use, so importing
`cohabit.units` (or running `cohabit plan`) never imports httpx.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SDK_EXPORTS = frozenset(
    {
        "Client",
        "AsyncClient",
        "CohabitError",
        "APIError",
        "AuthenticationError",
        "NotFoundError",
        "ValidationError",
        "ConflictError",
        "ServerError",
        "ServerUnreachable",
        "DeploymentFailedError",
    }
)
__all__ = ["__version__", *sorted(_SDK_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _SDK_EXPORTS:
        # By name, not `from cohabit import sdk`: every layer reads `__version__` from here, and
        # a static import would make each of them look (to import-linter) as if it used the SDK.
        return getattr(importlib.import_module("cohabit.sdk"), name)
    raise AttributeError(f"module 'cohabit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _SDK_EXPORTS)
