"""The SDK keeps its own copies of the API's schemas (the client must not import the server),
so this checks them against the server's OpenAPI document: every field the server sends, the
SDK declares, and every field the SDK sends, the server accepts. Drift fails here first."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from cohabit.hardware.model import Fleet, Node
from cohabit.sdk import schemas as sdk
from cohabit.service.app import Backend, create_app
from cohabit.service.settings import Settings
from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The document the real app publishes (built without starting it)."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("contract"))
    fleet = Fleet(nodes=(Node(name="box", memory_bytes=16 * GIB),))
    return create_app(settings, Backend(runtime=ScriptedRuntime(), fleet=fleet)).openapi()


def server_fields(openapi: dict[str, Any], name: str) -> set[str]:
    return set(openapi["components"]["schemas"][name]["properties"])


def wire_names(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


@pytest.mark.parametrize(
    ("server_schema", "sdk_model"),
    [
        ("Deployment", sdk.Deployment),
        ("DeploymentEvents", sdk.DeploymentEvents),
        ("DeploymentEvent", sdk.DeploymentEvent),
        ("ModelInstance", sdk.ModelInstance),
        ("LoadProgress", sdk.LoadProgress),
        ("VramEstimate", sdk.VramEstimate),
        ("ContainerLogResponse", sdk.ContainerLogResponse),
        ("ContainerLogPatternResponse", sdk.ContainerLogPatternResponse),
        ("Model", sdk.Model),
        ("ModelFile", sdk.ModelFile),
        ("ModelConfig", sdk.ModelConfig),
        ("Hardware", sdk.HardwareNode),
        ("Slot", sdk.HardwareSlot),
        ("UserInfo", sdk.UserInfo),
        ("Pat", sdk.ApiToken),
        ("PatCreated", sdk.CreatedToken),
        ("ModelDownloadResult", sdk.DownloadStarted),
        ("ModelDownloadStatus", sdk.DownloadStatus),
        ("VariantList", sdk.VariantList),
        ("VariantInfo", sdk.Variant),
    ],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_the_sdk_declares_every_field_the_server_sends(
    openapi: dict[str, Any], server_schema: str, sdk_model: type[BaseModel]
) -> None:
    missing = server_fields(openapi, server_schema) - wire_names(sdk_model)
    assert not missing, f"{sdk_model.__name__} does not declare {sorted(missing)}"


@pytest.mark.parametrize(
    ("server_schema", "sdk_model"),
    [
        ("CreateModelDeployment", sdk.CreateModelDeployment),
        ("CreateModel", sdk.CreateModel),
        ("CreateModelConfig", sdk.CreateModelConfig),
    ],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_the_server_accepts_every_field_the_sdk_sends(
    openapi: dict[str, Any], server_schema: str, sdk_model: type[BaseModel]
) -> None:
    unknown = wire_names(sdk_model) - server_fields(openapi, server_schema)
    assert not unknown, f"the server's {server_schema} has no {sorted(unknown)}"
