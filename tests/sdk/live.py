"""A real `cohabit serve` (subprocess, loopback port, token) on a simulated CPU box, with the
real local runtime serving the tiny GGUF model through llama.cpp — what the SDK and CLI tests
talk to. Every engine it started is stopped, and killed if it outlives the server. And the
command line pointed at it, as a user's shell would be."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.sdk import Client
from tests.cli.test_serve import CPU_BOX, cohabit_serve
from tests.conftest import cli_json
from tests.e2e.engines import kill_engines

TOKEN = "s3cret-0f-16-chars"
POOL_GIB = 8  # CPU_BOX: 16 GiB of memory, less the 8 GiB OS reserve
FAST = {"poll_interval_seconds": 0.1, "timeout_seconds": 120}


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveServer:
    api: str  # http://127.0.0.1:PORT/api
    token: str
    model_path: Path  # the tiny GGUF, not registered yet
    data_dir: Path

    def client(self) -> Client:
        return Client(self.api, self.token, timeout_s=30)

    def env(self) -> dict[str, str]:
        """What a CLI subprocess needs to reach it."""
        return {"COHABIT_BASE_URL": self.api, "COHABIT_API_TOKEN": self.token}


def stop_everything(server: LiveServer, *, timeout_s: float = 30.0) -> None:
    """Stop every active deployment and wait until none holds a budget."""
    with server.client() as client:
        for deployment in client.serving.list_deployments():
            if deployment.is_active:
                client.serving.stop_deployment(deployment.id)
        deadline = time.monotonic() + timeout_s
        while any(d.is_active for d in client.serving.list_deployments()):
            if time.monotonic() > deadline:
                raise AssertionError("deployments still active after stopping them")
            time.sleep(0.1)


@contextmanager
def live_server(tmp_path: Path) -> Iterator[LiveServer]:
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    data_dir = tmp_path / "data"
    try:
        with cohabit_serve(tmp_path, CPU_BOX, "--token", TOKEN) as (api, _process):
            server = LiveServer(api=api, token=TOKEN, model_path=model_path, data_dir=data_dir)
            try:
                yield server
            finally:
                stop_everything(server)
                time.sleep(1.0)  # the reconciler stops the engines on its next ticks
    finally:
        kill_engines(data_dir)


def point_at(server: LiveServer, env: pytest.MonkeyPatch) -> None:
    """Commands run from now on find `server` through the environment."""
    for key, value in server.env().items():
        env.setenv(key, value)


def add_tiny(server: LiveServer) -> dict[str, Any]:
    """`cohabit models add` of the tiny model as "tiny"; the model it printed as JSON."""
    with pytest.MonkeyPatch.context() as env:
        point_at(server, env)
        added: dict[str, Any] = cli_json("models", "add", str(server.model_path), "--name", "tiny")
    return added
