"""Our SDK's catalog upkeep against a live server: replace and delete a config, the memory a
model needs, its files, and deleting it (refused while deployed, then done, files kept).
Engines are the in-process double."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohabit import sdk
from cohabit.units import GIB
from tests.estimate.tinymodels import write_gguf_model
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for


def test_catalog_upkeep(tmp_path: Path, database_url: str) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf_model(path)
    with (
        serving(settings_for(tmp_path, database_url, token="t"), ScriptedRuntime()) as api,
        sdk.Client(base_url=api, api_key="t") as client,
    ):
        model = client.models.add_model(path, name="tiny")
        (default,) = client.models.get_model_configs(model.id)
        short = client.models.config_with(model.id, {"max_model_len": 64})
        body = sdk.CreateModelConfig(m_id=model.id, name="short", config={"max_model_len": 32})
        replaced = client.models.update_model_config(short.id, body)
        assert (replaced.id, replaced.name, replaced.config) == (
            short.id,
            "short",
            {"max_model_len": 32},
        )
        assert client.models.delete_model_config(short.id).id == short.id
        assert [c.id for c in client.models.get_model_configs(model.id)] == [default.id]

        needed = client.models.get_model_memory_usage(model.id)
        assert needed > 0
        (listed,) = client.models.list_model_files()
        assert (listed.name, listed.size) == ("tiny.gguf", path.stat().st_size)

        deployment_id = client.serving.deploy_model(
            model_id=model.id, vram_allocation=GIB, poll_interval_seconds=0.05
        )
        with pytest.raises(sdk.ConflictError, match="active deployment"):
            client.models.delete_model(model.id)
        client.serving.stop_deployment(deployment_id)
        removed = client.models.delete_model(model.id, delete_files=True)
        assert removed["files_kept"] == [str(path.resolve())] and path.is_file()
        assert client.models.list_models() == []
