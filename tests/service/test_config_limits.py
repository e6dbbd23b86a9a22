"""A model config asking for more context than the model has is refused (422 naming the
field) before anything is written, over real HTTP: creating one stores nothing, replacing
one leaves it as it was, and a deploy would have been refused for it anyway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.estimate.tinymodels import write_safetensors_model
from tests.service.server import register_tiny_gguf, scripted_client

MODEL_LIMIT = 256  # tinymodels.TINY_CONFIG's max_position_embeddings


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path_factory.mktemp("limits"), module_database_url) as http:
        yield http


def register_safetensors(client: httpx.Client, directory: Path) -> dict[str, Any]:
    write_safetensors_model(directory)
    response = client.post("/models/", json={"path": str(directory)})
    assert response.status_code == 201, response.text
    model: dict[str, Any] = response.json()
    return model


def configs_of(client: httpx.Client, model_id: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = client.get(f"/models/{model_id}/configs").json()
    return listed


def test_a_config_over_the_models_context_is_refused_and_nothing_stored(
    client: httpx.Client, tmp_path: Path
) -> None:
    model = register_safetensors(client, tmp_path / "tiny-st")
    before = configs_of(client, model["id"])
    body = {"m_id": model["id"], "default": True, "config": {"max_model_len": 10**9}}
    refused = client.post("/model_configs/", json=body)
    assert refused.status_code == 422, refused.text
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", "config", "max_model_len"]
    assert problem["msg"] == (
        f"config.max_model_len: 1,000,000,000 tokens exceeds tiny-st's own {MODEL_LIMIT}"
    )
    assert configs_of(client, model["id"]) == before
    at_limit = body | {"config": {"max_model_len": MODEL_LIMIT}}
    assert client.post("/model_configs/", json=at_limit).status_code == 201


def test_replacing_a_config_with_too_much_context_leaves_it_as_it_was(
    client: httpx.Client, tmp_path: Path
) -> None:
    # A name of its own: the module shares one server, and a name names one model.
    model = register_safetensors(client, tmp_path / "replaced-st")
    [stored] = configs_of(client, model["id"])
    body = {"m_id": model["id"], "default": True, "config": {"max_model_len": MODEL_LIMIT + 1}}
    refused = client.put(f"/model_configs/{stored['id']}", json=body)
    assert refused.status_code == 422, refused.text
    assert client.get(f"/model_configs/{stored['id']}").json() == stored


def test_llamacpp_runs_past_the_trained_context_so_its_configs_may_ask(
    client: httpx.Client, tmp_path: Path
) -> None:
    """The estimator lets llama.cpp go beyond the model's context; so does the config check."""
    model = register_tiny_gguf(client, tmp_path)
    body = {"m_id": model["id"], "default": False, "config": {"max_model_len": 4096}}
    assert client.post("/model_configs/", json=body).status_code == 201
