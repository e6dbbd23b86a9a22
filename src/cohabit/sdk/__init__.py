"""The Python client of a cohabit server: `Client` (and its awaited twin `AsyncClient`) with
`client.serving` and `client.models`, mirroring the kamiwaza SDK's serving calls with typed,
placement-aware models. docs/sdk.md shows it in use; the `cohabit` CLI is built on it.
"""

from cohabit.sdk.client import AsyncClient, Client
from cohabit.sdk.errors import (
    APIError,
    AuthenticationError,
    CohabitError,
    ConflictError,
    DeploymentFailedError,
    NotFoundError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)
from cohabit.sdk.schemas import (
    ActiveDeployment,
    ContainerLogPatternResponse,
    ContainerLogResponse,
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
    VramEstimate,
)

__all__ = [
    "APIError",
    "ActiveDeployment",
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
    "Deployment",
    "DeploymentFailedError",
    "HardwareNode",
    "HardwareSlot",
    "Model",
    "ModelConfig",
    "ModelInstance",
    "NoFitDetails",
    "NotFoundError",
    "ServerError",
    "ServerUnreachable",
    "ValidationError",
    "VramEstimate",
]
