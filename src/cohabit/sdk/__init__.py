"""The Python client of a cohabit server: `Client` (and its awaited twin `AsyncClient`) with
`client.serving`, `client.models`, `client.cluster` and `client.auth`, mirroring the kamiwaza
SDK's serving calls with typed, placement-aware models. docs/sdk.md shows it in use; the
`cohabit` CLI is built on it.

Each name below loads on first use, so that importing one module of the SDK (the command
line's `ps` takes `http` and `calls` alone) imports neither httpx nor pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cohabit.sdk.client import AsyncClient, Client
    from cohabit.sdk.errors import (
        APIError,
        AuthenticationError,
        CohabitError,
        ConflictError,
        DeploymentFailedError,
        DownloadFailedError,
        NotFoundError,
        PermissionDeniedError,
        ServerError,
        ServerUnreachable,
        ValidationError,
    )
    from cohabit.sdk.schemas import (
        ActiveDeployment,
        ApiToken,
        ContainerLogPatternResponse,
        ContainerLogResponse,
        CreatedToken,
        CreateModel,
        CreateModelConfig,
        CreateModelDeployment,
        Deployment,
        DeploymentEvent,
        DeploymentEvents,
        DownloadStarted,
        DownloadStatus,
        HardwareNode,
        HardwareSlot,
        LoadProgress,
        Model,
        ModelConfig,
        ModelInstance,
        NoFitDetails,
        UserInfo,
        Variant,
        VariantList,
        VramEstimate,
    )

__all__ = [
    "APIError",
    "ActiveDeployment",
    "ApiToken",
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "CohabitError",
    "ConflictError",
    "ContainerLogPatternResponse",
    "ContainerLogResponse",
    "CreateModel",
    "CreateModelConfig",
    "CreateModelDeployment",
    "CreatedToken",
    "Deployment",
    "DeploymentEvent",
    "DeploymentEvents",
    "DeploymentFailedError",
    "DownloadFailedError",
    "DownloadStarted",
    "DownloadStatus",
    "HardwareNode",
    "HardwareSlot",
    "LoadProgress",
    "Model",
    "ModelConfig",
    "ModelInstance",
    "NoFitDetails",
    "NotFoundError",
    "PermissionDeniedError",
    "ServerError",
    "ServerUnreachable",
    "UserInfo",
    "ValidationError",
    "Variant",
    "VariantList",
    "VramEstimate",
]
# Where the names above live, the lightest first: a name is looked for in each in turn.
_HOMES = ("cohabit.sdk.errors", "cohabit.sdk.schemas", "cohabit.sdk.client")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module 'cohabit.sdk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
