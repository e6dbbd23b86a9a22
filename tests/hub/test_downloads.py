"""Downloads through cohabit's own SDK and CLI against an in-process server whose Hub is the
stand-in (recorded answers of the real Hub API, tests/hub/standin.py): a file that does not
match the hash the Hub publishes (LFS sha256, or the git blob sha1 of a small file) is an
error naming it and is not kept; HF_TOKEN reaches the Hub; offline mode asks it nothing; a
repo whose id another model has as its name is a 409 naming that model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cohabit.sdk import Client, DownloadFailedError
from tests.conftest import run_cli
from tests.estimate.tinymodels import write_gguf_model
from tests.hub.repos import TINY_REPO
from tests.hub.standin import StandInHub
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for


@pytest.fixture
def api(hub: StandInHub, tmp_path: Path, database_url: str) -> Iterator[str]:
    with serving(settings_for(tmp_path, database_url), ScriptedRuntime()) as url:
        yield url


def test_a_gguf_whose_sha256_differs_fails_the_pull_naming_it(
    api: str, hub: StandInHub, tmp_path: Path
) -> None:
    name = "tiny-llama-Q4_K_M.gguf"
    hub.corrupt.add(name)
    pulled = run_cli("models", "pull", f"{TINY_REPO}:Q4_K_M", "--url", api)
    assert pulled.returncode == 1, pulled.stdout
    assert f"{name}: sha256" in pulled.stderr and "does not match the Hub's" in pulled.stderr
    store = tmp_path / "data" / "models"
    assert not list(store.rglob(name)) and not list(store.rglob("*.part"))  # not kept, no part
    with Client(base_url=api) as client:
        (model,) = client.models.list_models()
        assert model.model_path is None  # nothing to deploy from
        hub.corrupt.clear()  # the Hub (or the network) heals: pulling again works
        started = client.models.download(TINY_REPO, variant="Q4_K_M")
        assert started.files == [name]
        client.models.wait_for_download(started, poll_interval_s=0.1, timeout_s=60)
        assert Path(str(client.models.get_model(model.id).model_path)).name == name


def test_a_small_file_is_checked_against_its_git_blob_sha1(api: str, hub: StandInHub) -> None:
    hub.corrupt.add("README.md")
    with Client(base_url=api) as client:
        started = client.models.download(TINY_REPO, files=["README.md"])
        with pytest.raises(DownloadFailedError) as failed:
            client.models.wait_for_download(started, poll_interval_s=0.1, timeout_s=60)
    assert list(failed.value.failures) == ["README.md"]
    assert "README.md: git blob sha1" in str(failed.value)


def test_hf_token_goes_to_the_hub(
    api: str, hub: StandInHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_reader_token")
    with Client(base_url=api) as client:
        started = client.models.download(TINY_REPO, variant="Q4_K_M")
        client.models.wait_for_download(started, poll_interval_s=0.1, timeout_s=60)
    asked = [headers.get("authorization") for _method, _path, headers in hub.seen]
    assert asked and set(asked) == {"Bearer hf_reader_token"}


def test_only_an_admin_reaches_the_hub_with_the_servers_token(
    hub: StandInHub, tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's HF_TOKEN may open private and gated repos: a `user` token's search, file
    listing and variant table ask the Hub with no token at all, an admin's with the server's
    (and neither sends a caller's cohabit token on)."""
    monkeypatch.setenv("HF_TOKEN", "hf_server_secret")
    settings = settings_for(tmp_path, database_url, token="admin-secret")
    reads = [
        ("POST", "/models/search/", {"json": {"query": "tiny"}}),
        ("POST", "/model_files/search/", {"json": {"model": TINY_REPO}}),
        ("GET", "/models/variants/", {"params": {"repo_id": TINY_REPO}}),
    ]

    def hub_authorization(token: str) -> set[str | None]:
        hub.seen.clear()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=api, headers=headers, timeout=30) as caller:
            for method, path, body in reads:
                response = caller.request(method, path, **body)
                assert response.status_code == 200, (path, response.text)
        return {found.get("authorization") for _method, _path, found in hub.seen}

    with serving(settings, ScriptedRuntime()) as api:
        with httpx.Client(base_url=api, timeout=30) as admin:
            admin.headers["Authorization"] = "Bearer admin-secret"
            minted = admin.post("/auth/pats", params={"name": "reader", "role": "user"})
            assert minted.status_code == 201, minted.text
        assert hub_authorization(minted.json()["token"]) == {None}
        assert hub_authorization("admin-secret") == {"Bearer hf_server_secret"}


def test_offline_mode_asks_the_hub_nothing(
    api: str, hub: StandInHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with httpx.Client(base_url=api, timeout=30) as client:
        search = client.post("/models/search/", json={"query": "tiny"})
        download = client.post("/models/download/", json={"model": TINY_REPO})
    assert search.status_code == download.status_code == 503
    assert "HF_HUB_OFFLINE" in search.json()["detail"]
    assert hub.seen == []


def test_unknown_repos_files_and_variants_are_one_clear_4xx(api: str) -> None:
    with httpx.Client(base_url=api, timeout=30) as client:
        no_repo = client.post("/models/download/", json={"model": "nobody/nothing-GGUF"})
        no_file = client.post(
            "/models/download/", json={"model": TINY_REPO, "files_to_download": ["x.gguf"]}
        )
        no_variant = client.post("/models/download/", json={"model": TINY_REPO, "variant": "Q2_K"})
    assert no_repo.status_code == 404 and "nobody/nothing-GGUF" in no_repo.json()["detail"]
    assert no_file.status_code == 422 and "'x.gguf'" in no_file.json()["detail"][0]["msg"]
    assert no_variant.status_code == 422
    assert "Q4_K_M, Q8_0, F16" in no_variant.json()["detail"][0]["msg"]


def test_hf_cache_puts_the_files_in_the_shared_hugging_face_cache(
    api: str, hub: StandInHub, tmp_path: Path
) -> None:
    with Client(base_url=api) as client:
        started = client.models.download(TINY_REPO, variant="Q8_0", hf_cache=True)
        client.models.wait_for_download(started, poll_interval_s=0.1, timeout_s=60)
        path = Path(str(client.models.get_model(started.model_id).model_path))
    hf_home = Path(os.environ["HF_HOME"])
    assert path.is_relative_to(hf_home / "hub" / "models--cohabit-test--tiny-llama-GGUF")
    assert path.name == "tiny-llama-Q8_0.gguf" and path.is_file()
    assert not (tmp_path / "data" / "models").exists()  # nothing in the store


def test_a_repo_id_another_model_has_as_its_name_is_a_409_naming_it(
    api: str, tmp_path: Path
) -> None:
    write_gguf_model(tmp_path / "local.gguf")
    with httpx.Client(base_url=api, timeout=30) as client:
        local = client.post(
            "/models/", json={"name": TINY_REPO, "path": str(tmp_path / "local.gguf")}
        )
        assert local.status_code == 201, local.text
        download = client.post("/models/download/", json={"model": TINY_REPO})
        assert download.status_code == 409
        assert download.json() == {
            "detail": f"model name {TINY_REPO!r} is taken by model {local.json()['id']}"
        }
        assert [model["id"] for model in client.get("/models/").json()] == [local.json()["id"]]
