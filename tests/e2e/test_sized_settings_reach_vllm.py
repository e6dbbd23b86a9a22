"""The engine that runs is the one that was sized: a model config that sets max_num_seqs 16,
kv_cache_dtype fp8 and max_model_len 4096 is deployed through `cohabit serve` (real API,
real LocalRuntime) on a fleet file with an H100, so vLLM is chosen; a fake `vllm` first on
PATH (tests/fixtures/runtime/fake_vllm.py — no GPU here) records the argv and environment
it was started with. The flags are exactly those settings, and the bytes reserved are the
estimate of exactly those settings; with `cohabit serve --vllm-kv-cache-bytes` the budget
reaches vLLM as --kv-cache-memory-bytes instead of a utilization."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cohabit.estimate import EngineSettings, estimate_model
from cohabit.estimate.budget import VllmLaunchSettings, vllm_settings_for_budget
from cohabit.units import GIB
from tests.cli.test_serve import cohabit_serve
from tests.e2e.engines import kill_engines
from tests.e2e.test_two_models_on_one_card import ENDED, wait_status
from tests.estimate.tinymodels import write_safetensors_model
from tests.runtime.conftest import fake_vllm_on_path

H100 = (
    "nodes:\n  - name: node-a\n    gpus: [{index: 0, vendor: nvidia, product: H100, "
    "memory: 80GiB, uuid: GPU-4b1e7c2a-0d3f-4e5a-9b6c-7d8e9f0a1b2c}]\n"
)
SETTINGS = {"engine": "vllm", "max_num_seqs": 16, "kv_cache_dtype": "fp8", "max_model_len": 4096}


@pytest.mark.parametrize(
    "serve_args", [[], ["--vllm-kv-cache-bytes"]], ids=["utilization", "kv-cache-bytes"]
)
def test_vllm_runs_the_settings_its_budget_was_sized_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_args: list[str]
) -> None:
    model_dir = tmp_path / "tiny-llama"
    write_safetensors_model(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    record_path = fake_vllm_on_path(tmp_path, monkeypatch)
    sized = estimate_model(
        model_dir,
        engine="vllm",
        settings=EngineSettings(max_num_seqs=16, kv_cache_dtype="fp8", max_model_len=4096),
    )
    fit = vllm_settings_for_budget(
        sized, budget_bytes=sized.total_bytes, device_total_bytes=80 * GIB
    )
    assert isinstance(fit, VllmLaunchSettings)
    with (
        cohabit_serve(tmp_path, H100, *serve_args) as (api, _process),
        httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
    ):
        try:
            model = client.post("/models/", json={"name": "tiny", "path": str(model_dir)})
            assert model.status_code == 201, model.text
            config_body = {"m_id": model.json()["id"], "default": True, "config": SETTINGS}
            assert client.post("/model_configs/", json=config_body).status_code == 201
            deployed = client.post("/serving/deploy_model", json={"m_id": model.json()["id"]})
            assert deployed.status_code == 202, deployed.text
            record = wait_status(client, deployed.json(), {"DEPLOYED", *ENDED})
            assert record["status"] == "DEPLOYED", record["last_error_message"]
            assert record["engine_name"] == "vllm"
            assert record["requested_bytes"] == sized.total_bytes
            assert record["allocated_bytes"] == sized.total_bytes
            assert record["estimate"] == sized.to_dict()
            process = record["spawner_process"]
            assert process["pid"] == int(record["instances"][0]["container_id"])
            assert process["rss_bytes"] > 0 and process["healthy"] is True
            assert record["health_details"]["probes"] == {"readiness": "passing"}
            assert record["gpu_memory_utilization"] == round(sized.total_bytes / (80 * GIB), 4)
        finally:
            kill_engines(tmp_path / "data")
    launched = json.loads(record_path.read_text())
    argv = launched["argv"]
    memory = ["--gpu-memory-utilization", f"{fit.gpu_memory_utilization:g}"]
    if serve_args:
        memory = ["--kv-cache-memory-bytes", str(fit.kv_cache_memory_bytes)]
    assert argv == [
        "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", argv[argv.index("--port") + 1],
        "--served-model-name=tiny",
        "--tensor-parallel-size", "1",
        *memory,
        "--max-model-len", "4096",
        "--max-num-seqs", "16",
        "--max-num-batched-tokens", str(sized.max_num_batched_tokens),
        "--kv-cache-dtype=fp8",
    ]  # fmt: skip
    assert "CUDA_VISIBLE_DEVICES" in launched["env"]
