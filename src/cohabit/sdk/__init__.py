"""The Python client of a cohabit server: `Client` (and its awaited twin `AsyncClient`) with
`client.serving`, `client.models`, `client.cluster` and `client.auth`, mirroring the kamiwaza
SDK's serving calls with typed, placement-aware models. docs/sdk.md shows it in use; the
`cohabit` CLI is built on it.
"""

from cohabit.sdk.client import AsyncClient, Client
from cohabit.sdk.errors import (
    APIError,
    AuthenticationError,
    CohabitError,
    ConflictError,
    DeploymentFailedError,
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
    HardwareNode,
    HardwareSlot,
    Model,
    ModelConfig,
    ModelInstance,
    NoFitDetails,
    UserInfo,
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
    "DeploymentFailedError",
    "HardwareNode",
    "HardwareSlot",
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
    "VramEstimate",
]
