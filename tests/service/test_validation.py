"""Input checked at the edge, over real HTTP, on SQLite and PostgreSQL alike: names longer than
their column, NUL and control characters in names, paths and repo ids, `~user` paths of no
such user, non-finite numbers (also as the JSON literals `NaN`/`Infinity`) — each a 422
whose `detail` is a list of `{loc, msg, type}` naming the field, and nothing stored."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.estimate.tinymodels import write_gguf_model
from tests.service.server import register_tiny_gguf, scripted_client

NO_SUCH_USER = "~cohabit-no-such-user-7f3a"
LONG_NAME = "n" * 256


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, module_database_url: str
) -> Iterator[httpx.Client]:
    with scripted_client(tmp_path_factory.mktemp("edge"), module_database_url) as http:
        yield http


@pytest.fixture(scope="module")
def model(client: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return register_tiny_gguf(client, tmp_path_factory.mktemp("tiny"))


def _refused(response: httpx.Response, loc: list[str | int], words: str) -> None:
    assert response.status_code == 422, response.text
    problems = response.json()["detail"]
    assert [p["loc"] for p in problems] == [loc], problems
    assert words in problems[0]["msg"]
    assert isinstance(problems[0]["type"], str)


def _counts(client: httpx.Client) -> tuple[int, int, int]:
    return (
        len(client.get("/models/").json()),
        len(client.get("/model_configs/").json()),
        len(client.get("/serving/deployments").json()),
    )


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({"name": "t\x00x", "path": "{gguf}"}, ["body", "name"], "control character '\\x00'"),
        ({"name": "t\nx", "path": "{gguf}"}, ["body", "name"], "control character '\\n'"),
        ({"name": LONG_NAME, "path": "{gguf}"}, ["body", "name"], "at most 255 characters"),
        ({"repo_modelId": "org/" + LONG_NAME}, ["body", "repo_modelId"], "at most 255"),
        ({"repo_modelId": "org/m\x00"}, ["body", "repo_modelId"], "control character"),
        ({"path": "{gguf}\x00.gguf"}, ["body", "path"], "control character '\\x00'"),
        ({"path": f"{NO_SUCH_USER}/m.gguf"}, ["body", "path"], "no such user"),
        ({"source_repository": "/models/m\x00"}, ["body", "source_repository"], "control"),
        ({"source_repository": NO_SUCH_USER}, ["body", "source_repository"], "no such user"),
        (
            {"m_files": [{"storage_location": f"{NO_SUCH_USER}/x.gguf"}]},
            ["body", "m_files", 0, "storage_location"],
            "no such user",
        ),
        ({"path": "{gguf}", "description": "a\x00b"}, ["body", "description"], "control"),
        ({"path": "/" + "a" * 300 + ".gguf"}, ["body", "path"], "too long"),
        ({"path": "/nonexistent/m.gguf"}, ["body", "path"], "no such file or directory"),
        ({"source_repository": "/nonexistent"}, ["body", "source_repository"], "no such file"),
    ],
    ids=[
        "nul-in-name",
        "newline-in-name",
        "name-over-255",
        "repo-id-over-255",
        "nul-in-repo-id",
        "nul-in-path",
        "no-such-user-path",
        "nul-in-source",
        "no-such-user-source",
        "no-such-user-file",
        "nul-in-description",
        "component-too-long",
        "missing-path",
        "missing-source",
    ],
)
def test_registering_bad_input_is_a_422_naming_the_field(
    client: httpx.Client,
    tmp_path: Path,
    body: dict[str, Any],
    loc: list[str | int],
    words: str,
) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_gguf_model(gguf)
    sent = json.loads(json.dumps(body).replace("{gguf}", str(gguf)))
    before = _counts(client)
    _refused(client.post("/models/", json=sent), loc, words)
    assert _counts(client) == before


def test_a_name_of_exactly_255_characters_is_stored(client: httpx.Client, tmp_path: Path) -> None:
    """The column's length: accepted on both databases (PostgreSQL enforces it, SQLite not)."""
    write_gguf_model(tmp_path / "tiny.gguf")
    registered = client.post(
        "/models/", json={"name": "n" * 255, "path": str(tmp_path / "tiny.gguf")}
    )
    assert registered.status_code == 201, registered.text
    model = registered.json()
    assert client.get(f"/models/{model['id']}").json()["name"] == "n" * 255
    config = client.post(
        "/model_configs/", json={"m_id": model["id"], "default": False, "name": "c" * 255}
    )
    assert config.status_code == 201, config.text
    # Names the server makes from it (the default config's, the page's context variants) fit.
    [default] = client.get(f"/models/{model['id']}/configs", params={"default": True}).json()
    assert default["name"] == "n" * 247 + " default"
    root = str(client.base_url).rstrip("/").removesuffix("/api")
    variant = client.post(
        f"{root}/ui/context-config", json={"m_id": model["id"], "max_model_len": 128}
    )
    assert variant.status_code == 200, variant.text
    assert variant.json()["name"] == "n" * 242 + " · 128 tokens"  # 255 characters


@pytest.mark.parametrize(
    ("raw", "loc", "words"),
    [
        ('{"m_id": "{id}", "vram_allocation": Infinity}', ["body", "vram_allocation"], "finite"),
        ('{"m_id": "{id}", "vram_allocation": -Infinity}', ["body", "vram_allocation"], "finite"),
        ('{"m_id": "{id}", "vram_allocation": NaN}', ["body", "vram_allocation"], "finite"),
        ('{"m_id": "{id}", "vram_allocation": 1e300}', ["body", "vram_allocation"], "less than"),
        ('{"m_id": "{id}", "gpu_allocation": NaN}', ["body", "gpu_allocation"], "finite"),
        (
            '{"m_id": "{id}", "inferenceResources": {"cpu": {"x": [1, NaN]}}}',
            ["body", "inferenceResources"],
            "nan is not a finite number at cpu.x[1]",
        ),
        ('{"m_id": "{id}", "engine_name": "llama\\u0000cpp"}', ["body", "engine_name"], "control"),
        ('{"m_id": "{id}", "location": "' + "x" * 256 + '"}', ["body", "location"], "at most"),
    ],
    ids=[
        "infinity",
        "minus-infinity",
        "nan",
        "beyond-bigint",
        "nan-gpu-allocation",
        "nan-inside-resources",
        "nul-in-engine",
        "long-location",
    ],
)
@pytest.mark.parametrize("route", ["/serving/deploy_model", "/serving/estimate_model_vram"])
def test_deploy_bodies_with_non_finite_or_bad_values_are_a_422(
    client: httpx.Client,
    model: dict[str, Any],
    route: str,
    raw: str,
    loc: list[str | int],
    words: str,
) -> None:
    before = _counts(client)
    response = client.post(
        route,
        content=raw.replace("{id}", model["id"]),
        headers={"Content-Type": "application/json"},
    )
    _refused(response, loc, words)
    assert _counts(client) == before


@pytest.mark.parametrize(
    ("raw", "loc", "words"),
    [
        ('{"max_model_len": NaN}', ["body", "config"], "nan is not a finite number"),
        ('{"rope": {"factor": Infinity}}', ["body", "config"], "at rope.factor"),
        ('{"k": "a\\u0000b"}', ["body", "config"], "text at k contains '\\x00'"),
        ('{"k\\u0000": 1}', ["body", "config"], "contains '\\x00'"),
        ('{"k": "\\ud800"}', ["body", "config"], "contains '\\ud800'"),
    ],
    ids=["nan", "nested-infinity", "nul-in-value", "nul-in-key", "lone-surrogate"],
)
def test_configs_with_unstorable_values_are_a_422(
    client: httpx.Client, model: dict[str, Any], raw: str, loc: list[str | int], words: str
) -> None:
    before = _counts(client)
    body = f'{{"m_id": "{model["id"]}", "default": false, "config": {raw}}}'
    response = client.post(
        "/model_configs/", content=body, headers={"Content-Type": "application/json"}
    )
    _refused(response, loc, words)
    assert _counts(client) == before


def test_a_config_name_over_255_is_a_422(client: httpx.Client, model: dict[str, Any]) -> None:
    body = {"m_id": model["id"], "default": False, "name": LONG_NAME}
    _refused(client.post("/model_configs/", json=body), ["body", "name"], "at most 255")


def test_service_422s_have_the_validation_shape(
    client: httpx.Client, model: dict[str, Any]
) -> None:
    """A 422 the service raises (after parsing) looks like FastAPI's own."""
    response = client.post(
        "/serving/deploy_model", json={"m_id": model["id"], "engine_name": "tensorrt"}
    )
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "loc": ["body"],
                "msg": "unknown engine_name 'tensorrt' (use vllm, llamacpp, mlx)",
                "type": "invalid_input",
            }
        ]
    }
