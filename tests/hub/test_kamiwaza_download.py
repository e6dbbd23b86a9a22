"""The published kamiwaza-sdk client (1.3.0), unchanged, searching, downloading and waiting
for a model against a cohabit server whose Hub is the stand-in (recorded answers of the real
Hub API, tests/hub/standin.py), then deploying what it downloaded. Engines are the
in-process double; tests/hub/test_pull.py deploys on the real llama.cpp."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kamiwaza_sdk import KamiwazaClient

from tests.hub.repos import TINY_REPO
from tests.hub.standin import StandInHub
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for
from tests.service.test_sdk import FAST

TOKEN = "s3cret"


@pytest.fixture
def api(
    hub: StandInHub, tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    for name in ("KAMIWAZA_API_KEY", "KAMIWAZA_API_TOKEN", "KAMIWAZA_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    settings = settings_for(tmp_path, database_url, token=TOKEN)
    with serving(settings, ScriptedRuntime(log_dir=tmp_path)) as url:
        yield url


def test_search_download_wait_and_deploy(api: str, hub: StandInHub, tmp_path: Path) -> None:
    client = KamiwazaClient(base_url=api, api_key=TOKEN)
    found = client.models.search_models("tiny-llama", load_files=True)
    assert [m.repo_modelId for m in found] == [TINY_REPO]
    # The client's own quantization table knows these two of the three (not F16).
    assert {"q4_k_m", "q8_0"} <= set(found[0].available_quantizations)

    hub.throttle["tiny-llama-Q8_0.gguf"] = 800_000  # bytes/s: about two seconds to wait
    started = client.models.initiate_model_download(TINY_REPO, quantization="q8_0")
    assert started["result"]["files"] == ["tiny-llama-Q8_0.gguf"]
    statuses = client.models.wait_for_download(TINY_REPO, polling_interval=1, timeout=60)
    assert [(s.name, s.is_downloading, s.download_percentage) for s in statuses] == [
        ("tiny-llama-Q8_0.gguf", False, 100)
    ]
    model = client.models.get_model_by_repo_id(TINY_REPO)
    assert model is not None
    (file,) = model.m_files
    on_disk = Path(str(file.storage_location))
    assert on_disk.is_relative_to(tmp_path / "data" / "models" / TINY_REPO)
    published = hub.repos[TINY_REPO].files["tiny-llama-Q8_0.gguf"].sha256
    assert hashlib.sha256(on_disk.read_bytes()).hexdigest() == published

    (config,) = client.models.get_model_configs_for_model(model.id, default=True)
    assert config.config == {"engine": "llamacpp", "max_model_len": 256}  # from the file
    deployment_id = client.serving.deploy_model(model_id=model.id, **FAST)
    deployed = client.serving.get_deployment(deployment_id)
    assert deployed.status == "DEPLOYED"


def test_download_and_deploy_in_one_call(api: str) -> None:
    client = KamiwazaClient(base_url=api, api_key=TOKEN)
    outcome = client.models.download_and_deploy_model(TINY_REPO, quantization="q4_k_m", timeout=60)
    deployment = client.serving.get_deployment(outcome["deployment_id"])
    assert deployment.status in {"DEPLOYING", "INITIALIZING", "DEPLOYED"}
    model = client.models.get_model_by_repo_id(TINY_REPO)
    assert model is not None
    assert [f.name for f in model.m_files] == ["tiny-llama-Q4_K_M.gguf"]
