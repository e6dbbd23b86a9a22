"""`cohabit deploy` when the engine fails after placement or never gets ready, run as a user
runs it (a subprocess) against the real app on a loopback port whose engines are the
in-process runtime double from tests/service (an OOM or a hung start cannot be had on a CPU
box): the code, the engine's line and the documented fix, exit 3; giving up waiting, exit 5."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.sdk import Client
from cohabit.sdk.fixes import RUNTIME_FIXES
from tests.conftest import run_cli
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.server import serving, settings_for

SCRIPTS = {
    "oom": Script(
        fail_code=RuntimeErrorCode.OOM,
        fail_message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ),
    "hung": Script(ready_after_polls=10**9),
}


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.delenv("COHABIT_API_TOKEN", raising=False)
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with serving(settings, ScriptedRuntime(scripts=SCRIPTS)) as url, Client(url) as client:
        for name in SCRIPTS:
            client.models.add_model(write_tiny_model(tmp_path / f"{name}.gguf"), name=name)
        yield url


def test_an_engine_oom_prints_the_code_the_line_and_the_fix(api: str) -> None:
    result = run_cli("deploy", "oom", "--vram", "2GiB", "--url", api)

    assert result.returncode == 3
    assert "FAILED: OOM: torch.OutOfMemoryError: CUDA out of memory" in result.stderr
    assert f"fix: {RUNTIME_FIXES['OOM']}" in result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(run_cli("deploy", "oom", "--url", api, "--json").stdout)
    assert (document["status"], document["last_error_code"]) == ("FAILED", "OOM")
    assert document["fix"] == RUNTIME_FIXES["OOM"] and document["id"]


def test_giving_up_waiting_exits_5_and_the_deployment_goes_on(api: str) -> None:
    result = run_cli("deploy", "hung", "--timeout", "1", "--url", api)

    assert result.returncode == 5
    assert "was not ready after 1 s (last status INITIALIZING)" in result.stderr
    assert "it keeps going on the server" in result.stderr
    with Client(api) as client:
        (deployment,) = client.serving.list_deployments()
    assert deployment.status == "INITIALIZING"
