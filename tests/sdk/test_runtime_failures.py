"""Failures after placement, through the SDK: the real app on a loopback port (real HTTP,
SQLite) with the in-process runtime double from tests/service, because an engine that runs out
of GPU memory or never gets ready cannot be had on a CPU box. Each failure status raises
DeploymentFailedError with the code, the engine's line and the documented fix; an engine that
stays INITIALIZING raises TimeoutError; a server that goes away is retried, then reported."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.runtime.process import free_port
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.sdk import Client, DeploymentFailedError, ServerUnreachable
from cohabit.sdk.fixes import RUNTIME_FIXES
from cohabit.units import GIB
from tests.sdk.live import FAST
from tests.service.scripted_runtime import Script, ScriptedRuntime
from tests.service.server import serving, settings_for, wait_for

SCRIPTS = {
    "oom": Script(
        fail_code=RuntimeErrorCode.OOM,
        fail_message="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ),
    "exits": Script(fail_code=RuntimeErrorCode.CONTAINER_EXITED, fail_message="exit code 3"),
    "gone": Script(fail_code=RuntimeErrorCode.MUST_REDOWNLOAD, fail_message="no such file"),
    "slow": Script(ready_after_polls=10**9),
}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    with serving(settings, ScriptedRuntime(scripts=SCRIPTS)) as api, Client(api) as connected:
        yield connected


def deploy_named(client: Client, tmp_path: Path, name: str, **kwargs: object) -> object:
    path = write_tiny_model(tmp_path / f"{name}.gguf")
    model = client.models.add_model(path, name=name)
    return client.serving.deploy_model(model.id, vram_allocation=2 * GIB, **kwargs)


@pytest.mark.parametrize(
    ("name", "status", "code", "line"),
    [
        ("oom", "FAILED", "OOM", "CUDA out of memory"),
        ("exits", "ERROR", "CONTAINER_EXITED", "exit code 3"),
        ("gone", "MUST_REDOWNLOAD", "MUST_REDOWNLOAD", "no such file"),
    ],
    ids=["oom", "engine-exits", "files-gone"],
)
def test_a_failed_engine_raises_deployment_failed_error_with_the_fix(
    client: Client, tmp_path: Path, name: str, status: str, code: str, line: str
) -> None:
    with pytest.raises(DeploymentFailedError) as failed:
        deploy_named(client, tmp_path, name, **FAST)

    error = failed.value
    assert (error.status, error.last_error_code) == (status, code)
    assert error.last_error_message is not None and line in error.last_error_message
    assert error.fix == RUNTIME_FIXES[code]
    assert error.no_fit is None
    record = client.serving.get_deployment(str(error.deployment_id))
    assert record.last_error_at is not None and record.allocated_bytes is not None


def test_an_engine_that_never_gets_ready_times_out(client: Client, tmp_path: Path) -> None:
    """Waited for once its engine has started (INITIALIZING; on a loaded machine placing and
    starting it can take longer than the wait's own timeout), the wait times out saying so."""
    deployment_id = deploy_named(client, tmp_path, "slow", wait=False)
    status = client.serving.get_deployment_status
    wait_for(lambda: status(deployment_id) == "INITIALIZING", timeout_s=60)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as late:
        client.serving.wait_deployment_ready(
            deployment_id, timeout_seconds=0.5, poll_interval_seconds=0.05
        )
    assert time.monotonic() - started < 5
    assert late.value.status == "INITIALIZING"  # type: ignore[attr-defined]
    assert late.value.deployment_id == str(deployment_id)  # type: ignore[attr-defined]
    assert status(deployment_id) == "INITIALIZING"


def test_a_server_that_is_gone_is_retried_then_reported() -> None:
    port = free_port()  # nothing listens there
    with Client(f"http://127.0.0.1:{port}/api") as client:
        started = time.monotonic()
        with pytest.raises(ServerUnreachable, match=f"cannot reach the cohabit server at .*{port}"):
            client.serving.wait_deployment_ready(
                "00000000-0000-0000-0000-000000000001", poll_interval_seconds=0.2
            )
        assert time.monotonic() - started >= 0.4  # two pauses: three tries
