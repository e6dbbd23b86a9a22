"""The REST API over real HTTP on a loopback port: registering models (GGUF file, safetensors
directory, Hugging Face repo id from an offline cache), configs, estimates, hardware, logs,
and bad input — a 4xx with one `{"detail": …}` naming what is wrong, nothing stored."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.units import GIB
from tests.estimate.tinymodels import write_safetensors_model
from tests.service.server import (
    deploy,
    register_tiny_gguf,
    scripted_client,
    wait_status,
)

UNKNOWN = str(uuid.UUID(int=7))


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    """One server per database kind for the whole module; tests compare counts, not totals."""
    with scripted_client(tmp_path_factory.mktemp("api"), module_database_url) as http:
        yield http


def fresh_model(client: httpx.Client, tmp_path: Path) -> dict[str, Any]:
    """A tiny GGUF registered under a name of its own: the module shares one server, and a
    name names one model (tests that change its configs each need their own)."""
    return register_tiny_gguf(client, tmp_path, name=f"tiny-{uuid.uuid4().hex[:8]}")


def deployment_count(client: httpx.Client) -> int:
    return len(client.get("/serving/deployments").json())


def test_register_gguf_makes_a_default_llamacpp_config(
    client: httpx.Client, tmp_path: Path
) -> None:
    model = register_tiny_gguf(client, tmp_path)
    assert (model["format"], model["m_files"][0]["name"]) == ("gguf", "tiny.gguf")
    assert model["default_config"] == {"engine": "llamacpp", "max_model_len": 256}
    configs = client.get(f"/models/{model['id']}/configs").json()
    assert [(c["default"], c["m_id"]) for c in configs] == [(True, model["id"])]
    assert client.get("/model_configs/", params={"model_id": model["id"]}).json() == configs
    assert client.get(f"/models/{model['id']}").json()["id"] == model["id"]
    assert model["id"] in [m["id"] for m in client.get("/models/").json()]


def test_register_safetensors_directory_defaults_to_vllm(
    client: httpx.Client, tmp_path: Path
) -> None:
    write_safetensors_model(tmp_path / "tiny-st")
    response = client.post("/models/", json={"path": str(tmp_path / "tiny-st")})
    assert response.status_code == 201, response.text
    model = response.json()
    assert (model["name"], model["format"], model["default_config"]["engine"]) == (
        "tiny-st",
        "safetensors",
        "vllm",
    )
    assert {f["name"] for f in model["m_files"]} >= {"config.json"}


def test_register_repo_id_from_the_offline_hub_cache(
    client: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub cache laid out as huggingface_hub writes it (refs/main → snapshot), offline. The
    Hub is a boundary we cannot reach here; huggingface_hub reads its cache location and
    offline flag from `constants` at call time, so the test points those at the fake cache."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny" / "snapshots" / ("0" * 40)
    write_safetensors_model(snapshot)
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    response = client.post("/models/", json={"repo_modelId": "acme/tiny"})
    assert response.status_code == 201, response.text
    model = response.json()
    assert (model["repo_modelId"], model["hub"], model["model_path"]) == (
        "acme/tiny",
        "HubsHf",
        str(snapshot),
    )


def test_estimate_model_vram(client: httpx.Client, tmp_path: Path) -> None:
    model = fresh_model(client, tmp_path)
    estimate = client.post("/serving/estimate_model_vram", json={"m_id": model["id"]}).json()
    assert estimate["highest_node_vram"] == 16 * GIB
    assert estimate["estimation_source"] == "exact"
    assert estimate["computed_vram_estimate"] == estimate["estimate"]["total_bytes"] > 0
    override = client.post(
        "/serving/estimate_model_vram", json={"m_id": model["id"], "vram_allocation": GIB}
    ).json()
    assert (override["computed_vram_estimate"], override["estimation_source"]) == (GIB, "override")


def test_logs_instances_and_openapi(client: httpx.Client, tmp_path: Path) -> None:
    model = fresh_model(client, tmp_path)
    deployment_id = deploy(client, model["id"], vram_allocation=GIB).json()
    wait_status(client, deployment_id)
    logs = client.get(f"/serving/deployment/{deployment_id}/logs").json()
    assert logs["engine_type"] == "llamacpp" and logs["logs"][0].startswith("loading ")
    (instance,) = client.get(
        "/serving/model_instances", params={"deployment_id": deployment_id}
    ).json()
    assert (instance["deployment_id"], instance["status"]) == (deployment_id, "DEPLOYED")
    assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
    paths = client.get("/openapi.json").json()["paths"]
    assert "/api/serving/deploy_model" in paths and "/api/cluster/hardware" in paths


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "detail"),
    [
        ("get", f"/serving/deployment/{UNKNOWN}", None, 404, f"deployment {UNKNOWN} not found"),
        ("get", f"/serving/deployment/{UNKNOWN}/status", None, 404, "not found"),
        ("delete", f"/serving/deployment/{UNKNOWN}", None, 404, "not found"),
        ("get", f"/models/{UNKNOWN}", None, 404, f"model {UNKNOWN} not found"),
        ("get", f"/model_configs/{UNKNOWN}", None, 404, "model config"),
        ("post", "/serving/deploy_model", {"m_id": UNKNOWN}, 404, "model"),
        ("post", "/serving/deploy_model", {"m_id": "not-a-uuid"}, 422, "m_id"),
        ("post", "/serving/deploy_model", {}, 422, "m_id"),
        ("get", "/serving/deployment/not-a-uuid", None, 422, "deployment_id"),
        ("post", "/models/", {"path": "/no/such/model.gguf"}, 422, "no such file"),
        ("post", "/models/", {"name": "nothing"}, 422, "give a model to register"),
        ("post", "/model_configs/", {"m_id": UNKNOWN, "default": True}, 404, "model"),
    ],
    ids=[
        "deployment-unknown",
        "status-unknown",
        "stop-unknown",
        "model-unknown",
        "config-unknown",
        "deploy-unknown-model",
        "deploy-bad-uuid",
        "deploy-empty-body",
        "deployment-bad-uuid",
        "register-missing-path",
        "register-nothing",
        "config-unknown-model",
    ],
)
def test_bad_input_is_one_clear_4xx(
    client: httpx.Client,
    method: str,
    path: str,
    body: dict[str, object] | None,
    status: int,
    detail: str,
) -> None:
    before = deployment_count(client)
    response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert detail in json.dumps(response.json()["detail"])
    assert deployment_count(client) == before


def test_a_kv_cache_dtype_llamacpp_would_not_run_is_a_422(
    client: httpx.Client, tmp_path: Path
) -> None:
    model = fresh_model(client, tmp_path)
    config = client.post(
        "/model_configs/",
        json={"m_id": model["id"], "default": True, "config": {"kv_cache_dtype": "fp8"}},
    )
    assert config.status_code == 201, config.text
    response = deploy(client, model["id"])
    assert response.status_code == 422
    assert "kv_cache_dtype 'fp8' is not passed to llama.cpp" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize(
    ("body", "status", "detail"),
    [
        ({"engine_name": "tensorrt"}, 422, "unknown engine_name 'tensorrt'"),
        ({"vram_allocation": 40 * GIB}, 409, "insufficient_capacity"),
        ({"vram_allocation": GIB, "force_cpu": True}, 409, "vendor_mismatch"),
        ({"m_config_id": UNKNOWN}, 404, "model config"),
    ],
    ids=["unknown-engine", "bigger-than-every-gpu", "no-cpu-pool", "unknown-config"],
)
def test_deploy_refused_at_admission_stores_nothing(
    client: httpx.Client, tmp_path: Path, body: dict[str, object], status: int, detail: str
) -> None:
    model = fresh_model(client, tmp_path)
    before = deployment_count(client)
    response = deploy(client, model["id"], **body)
    assert response.status_code == status, response.text
    assert detail in json.dumps(response.json()["detail"])
    assert deployment_count(client) == before


def test_admission_409_carries_the_structured_no_fit(client: httpx.Client, tmp_path: Path) -> None:
    model = fresh_model(client, tmp_path)
    detail = deploy(client, model["id"], vram_allocation=40 * GIB).json()["detail"]
    assert detail["error"] == "placement_no_fit"
    assert (detail["requested_capacity_gb"], detail["largest_available_capacity_gb"]) == (40, 16)
    assert detail["largest_available_location"] == "node-a gpu 0"
    assert detail["message"].startswith("0/1 nodes fit")
    assert (detail["candidates_filtered"], detail["candidates_remaining"]) == (1, 0)
    assert detail["candidates_filtered_by_filter"] == {"insufficient GPU memory": 1}


def test_config_the_engine_would_refuse_is_a_422(client: httpx.Client, tmp_path: Path) -> None:
    model = fresh_model(client, tmp_path)
    config = client.post(
        "/model_configs/",
        json={"m_id": model["id"], "default": True, "config": {"max_model_len": 0}},
    )
    assert config.status_code == 201, config.text
    configs = client.get(f"/models/{model['id']}/configs", params={"default": True}).json()
    assert [c["id"] for c in configs] == [config.json()["id"]]  # the new default took the flag
    response = deploy(client, model["id"])
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert "max_model_len must be at least 1, got 0" in problem["msg"]
    assert (problem["loc"], problem["type"]) == (["body"], "invalid_input")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("two", "got 'two'"), (None, "got None")],
    ids=["string", "null"],
)
def test_a_config_value_of_the_wrong_type_is_a_422_naming_the_key(
    client: httpx.Client, tmp_path: Path, value: object, expected: str
) -> None:
    model = fresh_model(client, tmp_path)
    config = client.post(
        "/model_configs/",
        json={"m_id": model["id"], "default": True, "config": {"tensor_parallel_size": value}},
    )
    assert config.status_code == 201, config.text
    before = deployment_count(client)
    response = deploy(client, model["id"])
    assert response.status_code == 422
    [problem] = response.json()["detail"]
    assert problem["msg"] == (
        f"model config {config.json()['id']}: tensor_parallel_size must be a whole number, "
        f"{expected}"
    )
    assert deployment_count(client) == before
