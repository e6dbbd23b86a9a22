"""Failures through the service with real engine processes (fake engines recorded from real
vLLM/PyTorch logs, tests/fixtures/runtime/fake_engine.py): each ends its deployment with the
right status, `last_error_code`, the engine's own line in `last_error_message`, a
`last_error_at`, and its budget released; a deployed engine that dies later too. Then the
gateway's refusals (OpenAI-style errors) and the logs API over the same engines. No GPU."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from cohabit.runtime.process import group_alive
from tests.e2e.engines import engine_pid
from tests.e2e.fake_service import GATEWAY_WAIT_S, FakeService, fake_service
from tests.service.server import wait_for, wait_status

ENDED = {"ERROR", "FAILED", "MUST_REDOWNLOAD", "STOPPED"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeService]:
    with fake_service(tmp_path_factory.mktemp("failures")) as running:
        yield running


@pytest.fixture(autouse=True)
def nothing_left_reserved(service: FakeService) -> Iterator[None]:
    """Every test starts and ends with the whole card free (each must release its budget)."""
    assert service.reserved_bytes() == 0
    yield
    assert service.reserved_bytes() == 0


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    ("mode", "status", "code", "message"),
    [
        pytest.param(
            "exit",
            "ERROR",
            "CONTAINER_EXITED",
            r"engine exited \(exit code 3\); last line: fake-engine: unrecognized arguments: "
            r"--bogus-flag",
            id="exits-at-once",
        ),
        pytest.param(
            "oom",
            "FAILED",
            "OOM",
            r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 2\.00 GiB\. .*"
            r"\(exit code 1\)",
            id="cuda-oom",
        ),
        pytest.param(
            "never",
            "FAILED",
            "STARTUP_TIMEOUT",
            r"not ready after 1\.5 s \(http://127\.0\.0\.1:\d+/health did not answer\); "
            r"last line: fake-engine: loading weights \.\.\.",
            id="never-ready",
        ),
        pytest.param(
            "deleted",
            "MUST_REDOWNLOAD",
            "MUST_REDOWNLOAD",
            r"model files missing on disk: .*/deleted\.gguf \(download the model again\)",
            id="model-file-deleted",
        ),
    ],
)
def test_engine_failure_ends_the_deployment_and_frees_its_budget(
    service: FakeService, mode: str, status: str, code: str, message: str
) -> None:
    model = service.register(mode)
    if mode == "deleted":
        Path(model["model_path"]).unlink()
    before = datetime.now(UTC)
    deployment_id = service.deploy(model["id"])
    record = wait_status(service.client, deployment_id, ENDED, timeout_s=30)
    assert (record["status"], record["last_error_code"]) == (status, code)
    assert re.fullmatch(message, record["last_error_message"]), record["last_error_message"]
    assert before <= parse_time(record["last_error_at"]) <= datetime.now(UTC)
    assert record["instances"] == []
    assert service.reserved_bytes() == 0
    handle_pid = engine_pid(service.runtime.data_dir, deployment_id)
    assert handle_pid is None or not group_alive(handle_pid)


def test_a_deployed_engine_that_dies_later_is_an_error_and_frees_its_budget(
    service: FakeService,
) -> None:
    deployment_id = service.deploy(service.register("serve")["id"])
    record = wait_status(service.client, deployment_id, {"DEPLOYED", *ENDED}, timeout_s=30)
    assert record["status"] == "DEPLOYED", record["last_error_message"]
    assert service.reserved_bytes() == record["allocated_bytes"]
    pid = int(record["instances"][0]["container_id"])
    killed_at = datetime.now(UTC)
    os.killpg(pid, signal.SIGKILL)
    record = wait_status(service.client, deployment_id, ENDED, timeout_s=30)
    assert (record["status"], record["last_error_code"]) == ("ERROR", "CONTAINER_EXITED")
    assert record["last_error_message"].startswith("engine exited (killed by SIGKILL)")
    assert killed_at <= parse_time(record["last_error_at"]) <= datetime.now(UTC)
    assert service.reserved_bytes() == 0


def test_the_logs_api_serves_the_tail_and_the_patterns_it_shows(service: FakeService) -> None:
    deployment_id = service.deploy(service.register("oom")["id"])
    wait_status(service.client, deployment_id, ENDED, timeout_s=30)
    logs = service.client.get(f"/serving/deployment/{deployment_id}/logs").json()
    assert logs["engine_type"] == "llamacpp"
    assert logs["log_file_path"].endswith(f"{deployment_id}/engine.log")
    assert logs["logs"][0].startswith("[cohabit] ")  # the spawner's own start line
    assert logs["logs"][-1].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert logs["capture_active"] is False
    last = service.client.get(f"/serving/deployment/{deployment_id}/logs", params={"tail": 1})
    assert last.json()["logs"] == logs["logs"][-1:]
    patterns = service.client.get(f"/serving/deployment/{deployment_id}/logs/patterns").json()
    assert patterns["deployment_id"] == deployment_id
    assert {k for k, found in patterns["patterns_detected"].items() if found} == {
        "OOM",
        "RUNTIME_ERROR",  # the traceback header
    }
    assert [(f["pattern"], f["line"][:22]) for f in patterns["failure_lines"]] == [
        ("RUNTIME_ERROR", "Traceback (most recent"),
        ("OOM", "torch.OutOfMemoryError"),
    ]
    assert parse_time(patterns["analysis_timestamp"]) <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("call", "status_code", "code"),
    [
        pytest.param(
            ("POST", "/v1/chat/completions", {"model": "nobody", "messages": []}),
            404,
            "model_not_found",
            id="unknown-model",
        ),
        pytest.param(
            ("POST", "/v1/chat/completions", {"messages": []}),
            400,
            "missing_model",
            id="no-model-field",
        ),
        pytest.param(
            ("GET", "/runtime/models/00000000-0000-0000-0000-000000000007/v1/models", None),
            404,
            "deployment_not_found",
            id="unknown-deployment",
        ),
    ],
)
def test_gateway_refusals_are_openai_errors(
    service: FakeService, call: tuple[str, str, object], status_code: int, code: str
) -> None:
    method, path, body = call
    response = httpx.request(method, f"{service.root}{path}", json=body, trust_env=False)
    assert response.status_code == status_code
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_gateway_routes_a_deployed_engine_and_refuses_one_not_ready(
    service: FakeService,
) -> None:
    ready = service.deploy(service.register("serve")["id"])
    loading = service.deploy(service.register("slow")["id"])
    try:
        record = wait_status(service.client, ready, {"DEPLOYED", *ENDED}, timeout_s=30)
        assert record["status"] == "DEPLOYED", record["last_error_message"]
        assert record["access_path"] == f"/runtime/models/{ready}"
        assert record["endpoint"] == f"{service.root}/runtime/models/{ready}/v1"
        models = httpx.get(f"{record['endpoint']}/models", trust_env=False)
        assert (models.status_code, models.json()["data"][0]["id"]) == (200, "fake")
        listed = httpx.get(f"{service.root}/v1/models", trust_env=False).json()
        assert "serve" in [m["id"] for m in listed["data"]]

        wait_status(service.client, loading, {"INITIALIZING"}, timeout_s=30)
        for url, body in [
            (f"{service.root}/runtime/models/{loading}/v1/chat/completions", {"model": "slow"}),
            (f"{service.root}/v1/chat/completions", {"model": "slow", "messages": []}),
        ]:
            refused = httpx.post(url, json=body, trust_env=False)  # held, then refused
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            error = refused.json()["error"]
            assert error["code"] == "deployment_not_ready"
            assert "INITIALIZING" in error["message"]
            assert f"after waiting {GATEWAY_WAIT_S:g} s" in error["message"]
    finally:
        for deployment_id in (ready, loading):
            service.client.delete(f"/serving/deployment/{deployment_id}")
    pids = [engine_pid(service.runtime.data_dir, d) for d in (ready, loading)]
    wait_for(lambda: not any(p is not None and group_alive(p) for p in pids), timeout_s=30)


def test_with_a_token_the_gateway_wants_it_too(tmp_path: Path) -> None:
    with fake_service(tmp_path, token="s3cret") as secured:
        url = f"{secured.root}/v1/chat/completions"
        body = {"model": "nobody", "messages": []}
        for headers in ({}, {"Authorization": "Bearer nope"}):
            refused = httpx.post(url, json=body, headers=headers, trust_env=False)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_api_key"
        right = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, json=body, headers=right, trust_env=False).status_code == 404
        assert httpx.get(f"{secured.root}/v1/models", trust_env=False).status_code == 401
