"""`cohabit estimate` as a user runs it: JSON bytes, a readable breakdown, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli
from tests.estimate.tinymodels import write_gguf_model, write_safetensors_model

CONFIGS = FIXTURES / "estimate" / "configs"


def test_json_on_a_safetensors_directory_uses_header_bytes(tmp_path: Path) -> None:
    written = write_safetensors_model(tmp_path / "tiny", extra_bytes=2048)
    result = run_cli("estimate", str(tmp_path / "tiny"), "--max-model-len", "128", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["weights_bytes"] == written
    assert data["sources"]["weights_bytes"] == "exact"
    assert data["tensor_parallel"] == 1
    for key in ("kv_cache_bytes_per_token", "kv_cache_bytes", "activation_bytes", "total_bytes"):
        assert isinstance(data[key], int)


def test_readable_breakdown_and_settings() -> None:
    result = run_cli(
        "estimate",
        str(CONFIGS / "llama-3.1-8b-instruct.json"),
        "--tp",
        "2",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "256",
        "--kv-cache-dtype",
        "fp8",
    )
    assert result.returncode == 0, result.stderr
    for text in ("weights", "KV cache", "total", "GiB", "32,768 bytes/token", "tp 2"):
        assert text in result.stdout


@pytest.mark.parametrize(
    ("version", "engine", "seqs", "tokens"),
    [
        pytest.param("0.6.6", "v0", 256, 16384, id="v0-release"),
        pytest.param("V0", "v0", 256, 16384, id="v0-mark"),
        pytest.param("0.11.0", "v1", 1024, 8192, id="v1-release"),
    ],
)
def test_engine_version_picks_the_profile_run(
    version: str, engine: str, seqs: int, tokens: int
) -> None:
    result = run_cli(
        "estimate",
        str(CONFIGS / "llama-3.1-8b-instruct.json"),
        "--max-model-len",
        "16384",
        "--engine-version",
        version,
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["engine_version"] == engine
    assert (data["max_num_seqs"], data["max_num_batched_tokens"]) == (seqs, tokens)


def test_gguf_on_llamacpp(tmp_path: Path) -> None:
    write_gguf_model(tmp_path / "m.gguf")
    result = run_cli(
        "estimate",
        str(tmp_path / "m.gguf"),
        "--engine",
        "llamacpp",
        "--max-model-len",
        "256",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["n_gpu_layers"] == 3
    assert data["sources"]["weights_bytes"] == "exact"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["/no/such/model"], "no such file", id="missing-file"),
        pytest.param([str(CONFIGS / "no-layers.json")], "num_hidden_layers", id="config-lacks"),
        pytest.param(
            [str(CONFIGS / "llama-3.1-8b-instruct.json"), "--tp", "3"], "does not divide", id="tp"
        ),
        pytest.param(
            [str(CONFIGS / "llama-3.1-8b-instruct.json"), "--engine", "tgi"],
            "unknown engine",
            id="engine",
        ),
        pytest.param(
            [str(CONFIGS / "llama-3.1-8b-instruct.json"), "--quantization", "hqq"],
            "unknown quantization",
            id="quantization",
        ),
        pytest.param(
            [str(CONFIGS / "llama-3.1-8b-instruct.json"), "--device-memory", "lots"],
            "--device-memory",
            id="size",
        ),
        pytest.param(
            [str(CONFIGS / "llama-3.1-8b-instruct.json"), "--engine-version", "latest"],
            "engine version",
            id="engine-version",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    result = run_cli("estimate", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_unknown_repo_id_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = run_cli("estimate", "no-such-org/no-such-model")
    assert result.returncode == 2
    assert "no-such-org/no-such-model" in result.stderr
    assert "Traceback" not in result.stderr
