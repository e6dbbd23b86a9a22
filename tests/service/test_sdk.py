"""The published kamiwaza-sdk client (1.3.0), unchanged, against a cohabit server on a loopback
port: register, deploy and wait, read, list, stop; and DeploymentFailedError carrying
last_error_code "NoFitError" when the card is full. Engines are the in-process double."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import pytest
from kamiwaza_sdk import KamiwazaClient
from kamiwaza_sdk.exceptions import (
    APIError,
    AuthenticationError,
    DeploymentFailedError,
    NotFoundError,
)
from kamiwaza_sdk.schemas.models.model import CreateModel
from kamiwaza_sdk.schemas.models.model_file import ModelFile

from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for

FAST = {"poll_interval_seconds": 0.05, "timeout_seconds": 30}


@pytest.fixture
def client(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[KamiwazaClient]:
    monkeypatch.delenv("KAMIWAZA_API_KEY", raising=False)
    settings = settings_for(tmp_path, database_url, token="s3cret")
    with serving(settings, ScriptedRuntime()) as api:
        yield KamiwazaClient(base_url=api, api_key="s3cret")


def register(client: KamiwazaClient, tmp_path: Path, name: str = "tiny") -> UUID:
    """Write a tiny GGUF `<name>.gguf` and register it as model `name` (repo local/<name>)."""
    path = tmp_path / f"{name}.gguf"
    write_gguf_model(path)
    model = client.models.create_model(
        CreateModel(
            name=name,
            repo_modelId=f"local/{name}",
            m_files=[ModelFile(name=path.name, storage_type="file", storage_location=str(path))],
        )
    )
    assert model.id is not None
    return model.id


def test_deploy_read_list_stop(client: KamiwazaClient, tmp_path: Path) -> None:
    model_id = register(client, tmp_path)
    configs = client.models.get_model_configs(model_id)
    assert [c.default for c in configs] == [True]

    deployment_id = client.serving.deploy_model(
        model_id=model_id, m_config_id=configs[0].id, wait=True, vram_allocation=6 * GIB, **FAST
    )
    assert isinstance(deployment_id, UUID)
    deployment = client.serving.get_deployment(deployment_id)
    assert deployment.status == "DEPLOYED"
    assert deployment.m_id == model_id and deployment.m_name == "tiny"
    raw = client.get(f"/serving/deployment/{deployment_id}")  # placement fields: beyond its model
    assert (raw["node_name"], raw["gpu_index"], raw["allocated_capacity_gb"]) == ("node-a", 0, 6)
    assert client.serving.get_deployment_status(deployment_id) == "DEPLOYED"
    assert [d.id for d in client.serving.list_deployments()] == [deployment_id]
    assert [d.id for d in client.serving.list_deployments(model_id=model_id)] == [deployment_id]
    assert [d.id for d in client.serving.list_active_deployments()] == [deployment_id]

    by_repo = client.serving.deploy_model(repo_id="local/tiny", vram_allocation=GIB, **FAST)
    assert client.serving.get_deployment(by_repo).status == "DEPLOYED"

    assert client.serving.stop_deployment(deployment_id) is True
    assert client.serving.get_deployment(deployment_id).status == "STOPPED"
    with pytest.raises(NotFoundError):
        client.serving.get_deployment(UUID(int=1))


def test_it_reads_and_stops_an_unloaded_deployment(client: KamiwazaClient, tmp_path: Path) -> None:
    """UNLOADED is beyond the statuses it knows: it parses, is listed (not as active, which
    it reads as DEPLOYED) and stops like any other."""
    model_id = register(client, tmp_path)
    kept = client.serving.deploy_model(
        model_id=model_id, wait=True, vram_allocation=GIB, min_copies=0, **FAST
    )
    assert client.serving.get_deployment(kept).status == "DEPLOYED"  # until its keep-alive
    deployment_id = client.serving.deploy_model(
        model_id=model_id, wait=False, vram_allocation=GIB, min_copies=0, starting_copies=0
    )
    assert client.serving.get_deployment(deployment_id).status == "UNLOADED"
    assert client.serving.get_deployment_status(deployment_id) == "UNLOADED"
    listed = {d.id: d.status for d in client.serving.list_deployments()}
    assert listed == {kept: "DEPLOYED", deployment_id: "UNLOADED"}
    assert [d.id for d in client.serving.list_active_deployments()] == [kept]
    assert client.serving.stop_deployment(deployment_id) is True
    assert client.serving.get_deployment(deployment_id).status == "STOPPED"


def test_no_fit_raises_deployment_failed_error(client: KamiwazaClient, tmp_path: Path) -> None:
    model_id = register(client, tmp_path)
    for _ in range(2):
        client.serving.deploy_model(model_id=model_id, vram_allocation=6 * GIB, **FAST)
    with pytest.raises(DeploymentFailedError) as failed:
        client.serving.deploy_model(model_id=model_id, vram_allocation=6 * GIB, **FAST)
    assert failed.value.status == "FAILED"
    assert failed.value.last_error_code == "NoFitError"
    assert failed.value.last_error_message.startswith("insufficient_capacity: 0/1 nodes fit")
    assert failed.value.deployment_id is not None


def test_request_bigger_than_every_device_is_refused_at_admission(
    client: KamiwazaClient, tmp_path: Path
) -> None:
    model_id = register(client, tmp_path)
    with pytest.raises(APIError) as refused:
        client.serving.deploy_model(model_id=model_id, vram_allocation=40 * GIB, **FAST)
    assert refused.value.status_code == 409
    assert client.serving.list_deployments() == []


def test_wrong_token_is_refused(tmp_path: Path, database_url: str) -> None:
    settings = settings_for(tmp_path, database_url, token="s3cret")
    with serving(settings, ScriptedRuntime()) as api:
        with pytest.raises(AuthenticationError) as refused:
            KamiwazaClient(base_url=api, api_key="wrong").serving.list_deployments()
        assert refused.value.status_code == 401
        health = KamiwazaClient(base_url=api, api_key="wrong").serving.get_health()
        assert {h["component"]: h["status"] for h in health}["database"] == "ok"
