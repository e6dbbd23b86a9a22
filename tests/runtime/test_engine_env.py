"""What an engine process really receives, read back from the kernel (/proc/<pid>/environ),
while the server's environment holds its API and metrics tokens, a database URL with its
password, Hugging Face tokens, a llama.cpp flag variable and a secret no list names: only
the allow-list of runtime/environment.py, the launcher's own variables and the marks reach
the engine, and its log writer gets the allow-list alone. The engine is the real llama.cpp
launcher's command, run by a stand-in `llama-server` (tests/e2e/engines.py) on a simulated
GPU, so the launcher's device variable is there to be seen."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cohabit.runtime import environment
from cohabit.runtime.interface import EngineState
from cohabit.runtime.process import DATA_DIR_MARK, DEPLOYMENT_MARK, RUNTIME_MARK, SavedEngine
from cohabit.runtime.spawner import LocalRuntime
from tests.e2e.engines import environ_of, fake_llama_server
from tests.runtime.conftest import launch_request, wait_for

Runtimes = Callable[..., LocalRuntime]

SECRETS = {
    "COHABIT_API_TOKEN": "bootstrap-admin-7f3a9c",
    "COHABIT_METRICS_TOKEN": "metrics-only-91c2d4",
    "COHABIT_DATABASE_URL": "postgresql+psycopg://cohabit:db-pass-5e1d@db.internal/cohabit",
    "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "HUGGING_FACE_HUB_TOKEN": "hf_legacy_name_for_the_same_token",
    "LLAMA_ARG_API_KEY": "llama-server-reads-LLAMA_ARG_-variables-as-flags",
    "AWS_SECRET_ACCESS_KEY": "a-secret-that-no-list-names",
}
KEPT = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
MARKS = {DEPLOYMENT_MARK, RUNTIME_MARK, DATA_DIR_MARK}


@pytest.fixture
def server_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's environment as a deployment sets it: secrets beside the ordinary, and a
    stand-in `llama-server` first on PATH."""
    for name, value in {**SECRETS, **KEPT}.items():
        monkeypatch.setenv(name, value)
    fake_llama_server(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


def leaked(env: dict[str, str]) -> list[str]:
    """The secrets found in `env`, by name or anywhere in a value."""
    return [
        name
        for name, secret in SECRETS.items()
        if name in env or any(secret in value for value in env.values())
    ]


@pytest.mark.usefixtures("server_env")
def test_an_engine_gets_none_of_the_servers_secrets(runtimes: Runtimes, model_file: Path) -> None:
    runtime = runtimes()
    request = launch_request("gpu16", 6, engine="llamacpp", model_path=str(model_file))
    handle = runtime.start(request)
    status = wait_for(runtime, handle, EngineState.READY, EngineState.FAILED)
    assert status.state is EngineState.READY, runtime.logs(handle)
    assert handle.pid is not None
    env = environ_of(handle.pid)
    assert leaked(env) == []
    assert {name: env.get(name) for name in KEPT} == KEPT
    assert env["PATH"] == os.environ["PATH"]
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-local-0"  # the launcher's own
    assert env[DEPLOYMENT_MARK] == handle.deployment_id
    allowed = {*environment.PASSED, *environment.UNBUFFERED, *MARKS, "CUDA_VISIBLE_DEVICES"}
    assert [n for n in env if n not in allowed and not n.startswith("LC_")] == []

    saved = SavedEngine.load(runtime.data_dir / "engines" / handle.deployment_id / "engine.json")
    assert saved is not None and saved.log_writer_pid is not None
    writer_env = environ_of(saved.log_writer_pid)
    assert leaked(writer_env) == []
    assert MARKS.isdisjoint(writer_env)  # never taken for the engine by adoption or sweep


@pytest.mark.parametrize(
    ("name", "passed"),
    [
        ("PATH", True),
        ("HOME", True),
        ("LC_MESSAGES", True),
        ("PYTHONPATH", True),
        ("LD_LIBRARY_PATH", True),
        ("CUDA_VISIBLE_DEVICES", False),  # devices come from the placement alone
        ("VLLM_API_KEY", False),  # vLLM would want it on every request (vllm/envs.py)
        ("HF_HOME", False),
        ("COHABIT_TEST_DATABASE_URL", False),
        ("HTTPS_PROXY", False),  # a proxy URL may carry a password
    ],
)
def test_only_the_allow_list_passes(name: str, passed: bool) -> None:
    assert (name in environment.passed({name: "x"})) is passed
