"""The SDK against a real `cohabit serve` on a loopback port, with real llama.cpp engines serving
the tiny GGUF on a simulated 16 GiB CPU box (8 GiB pool): register, deploy and wait, read the
placement fields, list, logs, chat through the gateway, stop; NoFit (while placing, and at
admission) → DeploymentFailedError with its fix; timeout → TimeoutError; estimate; auth; the
async twin. No mocks."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import cohabit
from cohabit.placement.reasons import HINTS, NoFitReason
from cohabit.sdk import (
    AsyncClient,
    AuthenticationError,
    Client,
    CreateModel,
    DeploymentFailedError,
    Model,
    NotFoundError,
)
from cohabit.units import GIB
from tests.sdk.live import FAST, POOL_GIB, LiveServer, live_server, stop_everything


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("sdk-live")) as running:
        yield running


@pytest.fixture
def client(server: LiveServer) -> Iterator[Client]:
    with server.client() as connected:
        yield connected
    stop_everything(server)


@pytest.fixture(scope="module")
def model(server: LiveServer) -> Model:
    with server.client() as client:
        return client.models.create_model(
            CreateModel(name="tiny", path=str(server.model_path), repo_modelId="local/tiny")
        )


def test_deploy_waits_and_the_record_says_where_it_landed(client: Client, model: Model) -> None:
    deployment_id = client.serving.deploy_model(model_id=model.id, **FAST)

    deployment = client.serving.get_deployment(deployment_id)
    assert deployment.status == "DEPLOYED"
    assert (deployment.m_id, deployment.m_name, deployment.engine_name) == (
        model.id,
        "tiny",
        "llamacpp",
    )
    assert (deployment.topology, deployment.node_name, deployment.gpu_index) == (
        "standalone_cluster",
        "box",
        None,
    )
    assert (deployment.hardware_class, deployment.sharing_class) == ("cpu", "cpu")
    assert deployment.gpu_vendor is None
    assert deployment.allocated_bytes is not None and 0 < deployment.allocated_bytes < GIB
    assert deployment.allocated_capacity_gb == 1
    assert deployment.last_error_code is None and deployment.last_error_at is None
    assert client.serving.get_deployment_status(deployment_id) == "DEPLOYED"
    assert [i.deployment_id for i in client.serving.list_model_instances(deployment_id)] == [
        deployment_id
    ]


def test_list_logs_chat_and_stop(client: Client, model: Model) -> None:
    deployment_id = client.serving.deploy_model(model.id, **FAST)

    assert deployment_id in [d.id for d in client.serving.list_deployments(model_id=model.id)]
    (active,) = client.serving.list_active_deployments()
    assert active.id == deployment_id and active.is_available
    assert active.endpoint == f"{client.base_url[:-4]}/runtime/models/{deployment_id}/v1"
    assert client.endpoint(deployment_id) == active.endpoint
    logs = client.serving.get_deployment_logs(deployment_id)
    assert logs.engine_type == "llamacpp" and logs.capture_active and logs.logs

    reply = client.openai(deployment_id).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.choices[0].message.content

    assert client.serving.stop_deployment(deployment_id) is True
    assert client.serving.get_deployment_status(deployment_id) == "STOPPED"
    assert client.serving.stop_deployment(deployment_id) is False
    assert client.serving.list_active_deployments() == []


def test_deploy_and_stop_by_repo_id(client: Client, model: Model) -> None:
    first = client.serving.deploy_model(repo_id="local/tiny", **FAST)
    second = client.serving.deploy_model(repo_id="local/tiny", wait=False)

    assert client.serving.stop_deployment(repo_id="local/tiny") is True
    statuses = {client.serving.get_deployment_status(d) for d in (first, second)}
    assert statuses == {"STOPPED"}
    assert client.serving.stop_deployment(repo_id="local/tiny") is False


def test_no_fit_while_placing_raises_deployment_failed_error(client: Client, model: Model) -> None:
    half = POOL_GIB // 2 + 1  # two of these never share the pool
    client.serving.deploy_model(model.id, vram_allocation=half * GIB, **FAST)

    with pytest.raises(DeploymentFailedError) as failed:
        client.serving.deploy_model(model.id, vram_allocation=half * GIB, **FAST)

    error = failed.value
    assert isinstance(error, RuntimeError)  # as the kamiwaza SDK's is
    assert (error.status, error.last_error_code) == ("FAILED", "NoFitError")
    assert error.last_error_message is not None
    assert error.last_error_message.startswith("insufficient_system_memory: 0/1 nodes fit")
    assert error.deployment_id is not None
    assert str(error).startswith(f"Deployment {error.deployment_id} entered failure status FAILED")
    assert error.fix == HINTS[NoFitReason.INSUFFICIENT_SYSTEM_MEMORY]
    assert error.no_fit is not None and error.no_fit["reason"] == "insufficient_system_memory"
    record = client.serving.get_deployment(error.deployment_id)
    assert record.no_fit is not None and record.last_error_at is not None


def test_what_never_fits_is_refused_at_admission(client: Client, model: Model) -> None:
    before = client.serving.list_deployments()

    with pytest.raises(DeploymentFailedError) as refused:
        client.serving.deploy_model(model.id, vram_allocation=40 * GIB, wait=False)

    error = refused.value
    assert (error.deployment_id, error.last_error_code) == (None, "NoFitError")
    assert error.no_fit is not None and error.no_fit["requested_capacity_gb"] == 40
    assert error.fix == HINTS[NoFitReason.INSUFFICIENT_SYSTEM_MEMORY]
    assert client.serving.list_deployments() == before


def test_waiting_past_the_timeout_raises_the_builtin_timeout_error(
    client: Client, model: Model
) -> None:
    with pytest.raises(TimeoutError) as late:
        client.serving.deploy_model(model.id, timeout_seconds=0.001, poll_interval_seconds=0.1)

    deployment_id = late.value.deployment_id  # type: ignore[attr-defined]
    assert isinstance(deployment_id, str)
    ready = client.serving.wait_deployment_ready(deployment_id, **FAST)  # it carried on
    assert ready.status == "DEPLOYED"


def test_estimate(client: Client, model: Model) -> None:
    estimate = client.serving.estimate_model_vram(model_id=model.id)
    assert 0 < estimate.computed_vram_estimate < GIB
    assert estimate.highest_node_vram == 8 * GIB  # the 16 GiB box less its 8 GiB OS reserve
    assert estimate.engine_name == "llamacpp" and not estimate.vram_exceeds_total
    assert estimate.estimate is not None

    override = client.serving.estimate_model_vram(model_id=model.id, vram_allocation=20 * GIB)
    assert (override.estimation_source, override.requested_capacity_gb) == ("override", 20)
    assert override.vram_exceeds_total


def test_unknown_ids_are_404_at_once(client: Client) -> None:
    unknown = uuid.uuid4()
    started = time.monotonic()
    with pytest.raises(NotFoundError):
        client.serving.wait_deployment_ready(unknown, poll_interval_seconds=5)
    assert time.monotonic() - started < 5  # a 4xx is not retried
    with pytest.raises(ValueError, match="no model with repo id 'no/such'"):
        client.serving.deploy_model(repo_id="no/such")


def test_token_and_url_come_from_the_environment(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COHABIT_BASE_URL", server.api)
    monkeypatch.setenv("COHABIT_API_TOKEN", server.token)
    with cohabit.Client() as client:
        assert client.serving.list_deployments() is not None
    with (
        cohabit.Client(api_key="wrong") as refused,
        pytest.raises(AuthenticationError, match="401"),
    ):
        refused.models.list_models()
    monkeypatch.delenv("COHABIT_API_TOKEN")
    with cohabit.Client() as anonymous:
        assert {h["component"] for h in anonymous.serving.get_health()} >= {"api", "database"}


def test_the_async_twin(server: LiveServer, model: Model) -> None:
    async def scenario() -> tuple[str, str, bool]:
        async with AsyncClient(server.api, server.token) as client:
            deployment_id = await client.serving.deploy_model(model_id=model.id, **FAST)
            deployment = await client.serving.get_deployment(deployment_id)
            stopped = await client.serving.stop_deployment(deployment_id)
            status = await client.serving.get_deployment_status(deployment_id)
            return deployment.status, status, stopped

    assert asyncio.run(scenario()) == ("DEPLOYED", "STOPPED", True)


def test_the_sdk_loads_only_when_used(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "import sys, cohabit.units, cohabit.placement; print('httpx' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"
    assert cohabit.DeploymentFailedError is DeploymentFailedError
