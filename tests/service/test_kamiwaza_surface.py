"""The published kamiwaza-sdk client (1.3.0), unchanged, against a cohabit server on a loopback
port, through the calls around the serving loop: its connection checks with an API key and
with none, personal access tokens and their roles, login, model and model-config upkeep,
model files and memory, model instances, engine logs, and the cluster views its "which
models fit my hardware" filter reads. Engines are the in-process double."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

import pytest
from kamiwaza_sdk import KamiwazaClient
from kamiwaza_sdk.authentication import UserPasswordAuthenticator
from kamiwaza_sdk.exceptions import (
    APIError,
    AuthenticationError,
    NotFoundError,
)
from kamiwaza_sdk.schemas.auth import PATCreate
from kamiwaza_sdk.schemas.models.model import CreateModelConfig
from kamiwaza_sdk.schemas.serving.serving import CreateModelDeployment
from kamiwaza_sdk.token_store import FileTokenStore

from cohabit.units import GIB
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for
from tests.service.test_sdk import FAST, register

TOKEN = "s3cret"


@pytest.fixture
def api(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in ("KAMIWAZA_API_KEY", "KAMIWAZA_API_TOKEN", "KAMIWAZA_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    settings = settings_for(tmp_path, database_url, token=TOKEN)
    with serving(settings, ScriptedRuntime(log_dir=tmp_path)) as url:
        yield url


@pytest.fixture
def admin(api: str) -> KamiwazaClient:
    return KamiwazaClient(base_url=api, api_key=TOKEN)


def test_connects_with_an_api_key_and_names_its_caller(api: str, admin: KamiwazaClient) -> None:
    assert KamiwazaClient(base_url=api).get("/ping")["status"] == "ok"  # open without a key
    me = admin.auth.get_current_user()
    assert (me.username, me.roles, me.sub) == ("bootstrap", ["admin"], "bootstrap")
    with pytest.raises(AuthenticationError) as refused:
        KamiwazaClient(base_url=api, api_key="wrong").auth.get_current_user()
    assert refused.value.status_code == 401


def test_connects_without_a_key_to_a_token_less_server(tmp_path: Path, database_url: str) -> None:
    with serving(settings_for(tmp_path, database_url), ScriptedRuntime()) as api:
        client = KamiwazaClient(base_url=api)
        assert client.get("/ping")["status"] == "ok"
        me = client.auth.get_current_user()
        assert (me.username, me.roles) == ("anonymous", ["admin"])
        assert client.serving.list_deployments() == []
        assert client.cluster.list_hardware()[0].name == "node-a"
        with pytest.raises(APIError) as refused:  # named tokens need a server with --token
            client.auth.create_pat(PATCreate(name="ci"))
        assert refused.value.status_code == 409


def test_pats_are_minted_listed_used_and_revoked(api: str, admin: KamiwazaClient) -> None:
    created = admin.auth.create_pat(PATCreate(name="ci", ttl_seconds=3600))
    assert created.token.startswith("cohabit_") and created.pat.name == "ci"
    assert created.pat.exp is not None
    assert abs(created.pat.exp - (datetime.now(UTC).timestamp() + 3600)) < 60
    user = KamiwazaClient(base_url=api, api_key=created.token)
    me = user.auth.get_current_user()
    assert (me.username, me.roles, me.sub) == ("ci", ["user"], created.pat.jti)

    listed = admin.auth.list_pats().pats
    assert [(p.name, p.revoked, p.owner_id) for p in listed] == [("ci", False, "bootstrap")]
    admin.auth.revoke_pat(created.pat.jti)
    with pytest.raises(AuthenticationError):
        user.serving.list_deployments()
    assert [p.revoked for p in admin.auth.list_pats().pats] == [True]


def test_a_user_token_reads_but_may_not_deploy_stop_delete_or_mint(
    api: str, admin: KamiwazaClient, tmp_path: Path
) -> None:
    model_id = register(admin, tmp_path)
    deployment_id = admin.serving.deploy_model(model_id=model_id, vram_allocation=GIB, **FAST)
    token = admin.post("/auth/pats", params={"name": "reader"})["token"]
    user = KamiwazaClient(base_url=api, api_key=token)

    assert [d.id for d in user.serving.list_deployments()] == [deployment_id]
    assert user.models.get_model(model_id).name == "tiny"
    assert user.cluster.list_hardware()[0].name == "node-a"
    refused = [
        lambda: user.serving.deploy_model(model_id=model_id, vram_allocation=GIB, wait=False),
        lambda: user.serving.stop_deployment(deployment_id),
        lambda: user.models.delete_model(model_id),
        lambda: user.auth.create_pat(PATCreate(name="more")),
        lambda: user.auth.list_pats(),
    ]
    for call in refused:
        with pytest.raises(APIError) as denied:  # the client types only reasoned 403s
            call()
        assert denied.value.status_code == 403
        assert "has role user" in str(denied.value)
    assert admin.serving.get_deployment(deployment_id).status == "DEPLOYED"


def test_login_takes_an_api_token_as_the_password(
    api: str, admin: KamiwazaClient, tmp_path: Path
) -> None:
    answer = admin.auth.login_with_password("anyone", TOKEN)
    assert (answer.access_token, answer.token_type) == (TOKEN, "bearer")
    client = KamiwazaClient(base_url=api)
    client.authenticator = UserPasswordAuthenticator(
        "ops", TOKEN, client.auth, token_store=FileTokenStore(tmp_path / "token.json")
    )
    client.authenticator.authenticate(client.session)
    assert client.auth.get_current_user().username == "bootstrap"
    with pytest.raises(AuthenticationError):
        admin.auth.login_with_password("anyone", "not-a-token")


def test_model_configs_are_replaced_and_deleted(admin: KamiwazaClient, tmp_path: Path) -> None:
    model_id = register(admin, tmp_path)
    (default,) = admin.models.get_model_configs(model_id)
    extra = admin.models.create_model_config(
        CreateModelConfig(m_id=model_id, name="short", default=False, config={"max_model_len": 64})
    )
    updated = admin.models.update_model_config(
        extra.id,
        CreateModelConfig(m_id=model_id, name="long", default=True, config={"max_model_len": 128}),
    )
    assert (updated.id, updated.name, updated.config, updated.default) == (
        extra.id,
        "long",
        {"max_model_len": 128},
        True,
    )
    assert updated.modified_at is not None
    assert {c.id: c.default for c in admin.models.get_model_configs(model_id)} == {
        default.id: False,
        extra.id: True,
    }
    admin.models.delete_model_config(extra.id)
    with pytest.raises(NotFoundError):
        admin.models.get_model_config(extra.id)
    assert [c.id for c in admin.models.get_model_configs(model_id)] == [default.id]


def test_a_deployed_model_is_not_deleted_and_its_files_stay(
    admin: KamiwazaClient, tmp_path: Path
) -> None:
    model_id = register(admin, tmp_path)
    (config,) = admin.models.get_model_configs(model_id)
    deployment_id = admin.serving.deploy_model(model_id=model_id, vram_allocation=GIB, **FAST)
    for delete in (
        lambda: admin.models.delete_model(model_id),
        lambda: admin.models.delete_model_config(config.id),
    ):
        with pytest.raises(APIError) as conflict:
            delete()
        assert conflict.value.status_code == 409
    admin.serving.stop_deployment(deployment_id)

    removed = admin.models.delete_model(model_id)
    assert (removed["deleted"], removed["deployments_removed"]) == (True, 1)
    assert removed["files_deleted"] == [] and (tmp_path / "tiny.gguf").is_file()
    with pytest.raises(NotFoundError):
        admin.models.get_model(model_id)
    with pytest.raises(NotFoundError):
        admin.serving.get_deployment(deployment_id)


def test_asked_to_delete_files_it_deletes_only_those_under_its_data_dir(
    admin: KamiwazaClient, tmp_path: Path
) -> None:
    outside = register(admin, tmp_path)
    (tmp_path / "data" / "models").mkdir(parents=True)
    inside = register(admin, tmp_path / "data" / "models", name="inside")
    kept = admin.delete(f"/models/{outside}", params={"delete_files": "true"})
    assert kept["files_deleted"] == []
    assert kept["files_kept"] == [str((tmp_path / "tiny.gguf").resolve())]
    assert "outside the server's data directory" in kept["files_kept_reason"]
    gone = admin.delete(f"/models/{inside}", params={"delete_files": "true"})
    assert gone["files_deleted"] == [str((tmp_path / "data" / "models" / "inside.gguf").resolve())]
    assert (tmp_path / "tiny.gguf").is_file()
    assert not (tmp_path / "data" / "models" / "inside.gguf").exists()


def test_model_files_and_memory_usage_agree_with_the_estimate(
    admin: KamiwazaClient, tmp_path: Path
) -> None:
    model_id = register(admin, tmp_path)
    (config,) = admin.models.get_model_configs(model_id)
    estimate = admin.serving.estimate_model_vram(
        CreateModelDeployment(m_id=model_id, m_config_id=config.id)
    )
    needed = admin.models.get_model_memory_usage(model_id)
    assert needed == int(estimate["computed_vram_estimate"]) > 0

    (listed,) = admin.models.list_model_files()
    assert (listed.name, listed.m_id, listed.size) == (
        "tiny.gguf",
        model_id,
        (tmp_path / "tiny.gguf").stat().st_size,
    )
    assert listed.id is not None
    assert admin.models.get_model_file(listed.id).storage_location == str(tmp_path / "tiny.gguf")
    assert admin.models.get_model_file_memory_usage(listed.id) == needed
    with pytest.raises(NotFoundError):
        admin.models.get_model_file(UUID(int=7))


def test_model_instance_and_engine_logs(admin: KamiwazaClient, tmp_path: Path) -> None:
    model_id = register(admin, tmp_path)
    deployment_id = admin.serving.deploy_model(model_id=model_id, vram_allocation=GIB, **FAST)
    (instance,) = admin.serving.list_model_instances(deployment_id)
    again = admin.serving.get_model_instance(instance.id)
    assert (again.deployment_id, again.status) == (deployment_id, "DEPLOYED")
    assert again.node_id == admin.cluster.list_hardware()[0].node_id

    listed = admin.serving.list_engine_logs("llamacpp")
    assert listed.engine_type == "llamacpp"
    ((entry),) = listed.logs
    assert entry["deployment_id"] == str(deployment_id)
    assert entry["log_file_path"].startswith(str(tmp_path))
    assert admin.serving.list_engine_logs("vllm").logs == []
    with pytest.raises(NotFoundError):
        admin.serving.list_engine_logs("nonsense")

    admin.serving.stop_deployment(deployment_id)
    with pytest.raises(NotFoundError):
        admin.serving.get_model_instance(instance.id)


def test_cluster_views_in_the_clients_shapes(admin: KamiwazaClient) -> None:
    (hardware,) = admin.cluster.list_hardware()
    assert hardware.name == "node-a" and hardware.os == "linux" and hardware.active
    assert hardware.gpus[0]["product"] == "Tesla T4"
    assert admin.cluster.list_hardware(limit=1) == [hardware]
    assert admin.cluster.list_hardware(skip=1) == []
    assert admin.cluster.get_hardware(hardware.id) == hardware
    raw = admin.get("/cluster/hardware")[0]  # the budgets beside the reference fields
    assert (raw["node_name"], raw["slots"][0]["capacity_gb"]) == ("node-a", 16)

    (node,) = admin.cluster.list_nodes()
    assert (node.id, node.hardware_id, node.active) == (hardware.node_id, hardware.id, True)
    assert node.last_config["name"] == "node-a"
    details = admin.cluster.get_node_by_id(node.id)
    assert details.node.id == node.id and details.hardware is not None
    assert details.hardware.id == hardware.id
    (running,) = admin.cluster.get_running_nodes()
    assert (running.node_id, running.alive, running.resources["GPU"]) == (
        str(node.id),
        True,
        1.0,
    )
    (cluster,) = admin.cluster.list_clusters()
    assert admin.cluster.get_cluster(cluster.id) == cluster
    assert node.location_id == cluster.location_id
    assert admin.cluster.get_location(cluster.location_id).id == cluster.location_id
    with pytest.raises(NotFoundError):
        admin.cluster.get_cluster(UUID(int=3))
    config = admin.cluster.get_runtime_config()
    assert (config["topology"], config["token_required"]) == ("standalone_cluster", True)
    assert admin.cluster.get_hostname() == {"hostname": socket.gethostname()}
    assert admin.models._get_server_os() == "linux"  # the hardware step of its fit filter


def test_cluster_ids_survive_a_restart(tmp_path: Path, database_url: str) -> None:
    settings = settings_for(tmp_path, database_url, token=TOKEN)
    seen = []
    for _ in range(2):
        with serving(settings, ScriptedRuntime()) as api:
            client = KamiwazaClient(base_url=api, api_key=TOKEN)
            (hardware,) = client.cluster.list_hardware()
            (cluster,) = client.cluster.list_clusters()
            seen.append((hardware.id, hardware.node_id, hardware.created_at, cluster.id))
    assert seen[0] == seen[1]
