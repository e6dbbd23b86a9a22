"""The routes behind the page, over real HTTP on 127.0.0.1 with the in-process runtime double
(no engine runs; the reconciler sees only the protocol): the dry run `POST /api/placement/plan`,
the context-length configs the form makes, and the token on every fragment but the page."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cohabit.store.database import sqlite_url
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import register_tiny_gguf, serving, settings_for, wait_status

GIB = 1 << 30


@pytest.fixture
def api(tmp_path: Path) -> Iterator[httpx.Client]:
    settings = settings_for(tmp_path, sqlite_url(tmp_path / "data"), token="s3cret")
    with (
        serving(settings, ScriptedRuntime()) as root,
        httpx.Client(
            base_url=root, timeout=30, headers={"Authorization": "Bearer s3cret"}
        ) as client,
    ):
        yield client


def root_of(api: httpx.Client) -> str:
    """The server's root (the page and its fragments live outside /api)."""
    return str(api.base_url).rstrip("/").removesuffix("/api")


@pytest.mark.parametrize(
    ("held_gib", "asked_gib", "expected"),
    [
        (0, 4, {"fits": True, "location": "node-a gpu 0", "free_gb_after": 12}),
        (12, 4, {"fits": True, "location": "node-a gpu 0", "free_gb_after": 0}),
        (
            12,
            8,
            {
                "fits": False,
                "reason": "insufficient_capacity",
                "largest_available_capacity_gb": 4,
                "largest_available_location": "node-a gpu 0",
            },
        ),
    ],
    ids=["empty-t4", "fills-the-rest", "no-fit-names-largest-free"],
)
def test_the_dry_run_places_against_what_is_held_now(
    api: httpx.Client, tmp_path: Path, held_gib: int, asked_gib: int, expected: dict[str, Any]
) -> None:
    model = register_tiny_gguf(api, tmp_path)
    if held_gib:
        held = api.post(
            "/serving/deploy_model", json={"m_id": model["id"], "vram_allocation": held_gib * GIB}
        ).json()
        wait_status(api, held, {"DEPLOYED"})
    before = api.get("/serving/deployments").json()
    response = api.post(
        "/placement/plan", json={"m_id": model["id"], "vram_allocation": asked_gib * GIB}
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["fits"] is expected["fits"]
    assert answer["requested_bytes"] == asked_gib * GIB
    if expected["fits"]:
        assert answer["no_fit"] is None
        assert answer["placement"]["location"] == expected["location"]
        assert answer["placement"]["free_gb_after"] == expected["free_gb_after"]
        assert answer["placement"]["hardware_class"] == "software_shared"
    else:
        assert answer["placement"] is None
        for key in ("reason", "largest_available_capacity_gb", "largest_available_location"):
            assert answer["no_fit"][key] == expected[key]
    assert api.get("/serving/deployments").json() == before  # nothing recorded


def test_the_dry_run_of_an_unknown_model_is_404(api: httpx.Client) -> None:
    response = api.post("/placement/plan", json={"m_id": str(uuid.uuid4())})
    assert response.status_code == 404
    assert "not found" in response.json()["detail"]


def test_a_context_length_becomes_one_config_per_length(api: httpx.Client, tmp_path: Path) -> None:
    model = register_tiny_gguf(api, tmp_path)
    default = api.get(f"/models/{model['id']}/configs").json()[0]
    ask = {"m_id": model["id"], "m_config_id": default["id"]}
    url = root_of(api) + "/ui/context-config"
    same = api.post(url, json=ask | {"max_model_len": 256}).json()
    assert same["m_config_id"] == default["id"]  # the config already has that length
    made = api.post(url, json=ask | {"max_model_len": 8192}).json()
    again = api.post(url, json=ask | {"max_model_len": 8192}).json()
    assert made["m_config_id"] == again["m_config_id"] != default["id"]
    config = api.get(f"/model_configs/{made['m_config_id']}").json()
    assert config["config"] == dict(default["config"]) | {"max_model_len": 8192}
    assert config["default"] is False
    bad = api.post(url, json=ask | {"max_model_len": 0})
    assert bad.status_code == 422
    assert "max_model_len" in str(bad.json()["detail"])


@pytest.mark.parametrize(
    ("path", "status"),
    [("/", 200), ("/ui/static/app.js", 200), ("/ui/fleet", 401), ("/ui/deployments", 401)],
    ids=["page-open", "script-open", "fleet-needs-token", "table-needs-token"],
)
def test_the_page_is_open_and_its_data_wants_the_token(
    api: httpx.Client, path: str, status: int
) -> None:
    root = root_of(api)
    assert httpx.get(root + path, timeout=30).status_code == status
    if status == 401:
        bearer = {"Authorization": "Bearer s3cret"}
        with_token = httpx.get(root + path, headers=bearer, timeout=30)
        assert with_token.status_code == 200
        assert "node-a" in with_token.text or "No deployments" in with_token.text
