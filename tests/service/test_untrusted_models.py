"""Crafted model files through the REST API (real HTTP on loopback, SQLite and PostgreSQL):
registering one, or estimating a registered model whose file was swapped for one, is a 422
whose `detail` names the file and the damage, answered at once; nothing is stored."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.estimate.tinymodels import TINY_CONFIG, write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import register_tiny_gguf, serving, settings_for


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    settings = settings_for(tmp_path_factory.mktemp("untrusted"), module_database_url)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as http,
    ):
        yield http


def crafted_gguf(path: Path) -> Path:
    """A sound tiny GGUF whose token array claims 10⁹ items (gguf-py's reader took 14.5 GB)."""
    write_gguf_model(path)
    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    struct.pack_into("<Q", data, data.index(key) + len(key) + 8, 10**9)
    path.write_bytes(bytes(data))
    return path


def model_count(client: httpx.Client) -> int:
    return len(client.get("/models/").json())


def test_registering_a_crafted_gguf_is_a_422_at_once(client: httpx.Client, tmp_path: Path) -> None:
    before = model_count(client)
    path = crafted_gguf(tmp_path / "evil.gguf")
    t0 = time.perf_counter()
    response = client.post("/models/", json={"name": "evil", "path": str(path)})
    elapsed = time.perf_counter() - t0
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]["msg"]
    assert str(path) in detail
    assert "'tokenizer.ggml.tokens' claims 1,000,000,000 items but only" in detail
    assert elapsed < 2.0
    assert model_count(client) == before


def test_safetensors_without_data_offsets_is_a_422(client: httpx.Client, tmp_path: Path) -> None:
    model = tmp_path / "no-offsets"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    header = json.dumps({"w": {"dtype": "F16", "shape": [2, 2]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    before = model_count(client)
    response = client.post("/models/", json={"path": str(model)})
    assert response.status_code == 422, response.text
    assert "model.safetensors: tensor 'w': no data_offsets" in response.json()["detail"][0]["msg"]
    assert model_count(client) == before


def test_a_file_swapped_after_registration_is_a_422_on_estimate(
    client: httpx.Client, tmp_path: Path
) -> None:
    model = register_tiny_gguf(client, tmp_path, name="swapped")
    crafted_gguf(tmp_path / "swapped.gguf")
    t0 = time.perf_counter()
    response = client.post("/serving/estimate_model_vram", json={"m_id": model["id"]})
    assert response.status_code == 422, response.text
    assert "claims 1,000,000,000 items" in response.json()["detail"][0]["msg"]
    assert time.perf_counter() - t0 < 2.0
