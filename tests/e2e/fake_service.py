"""The real app (in this process, on a loopback port) driving the real LocalRuntime, whose
llama.cpp launcher is replaced by fake engines (tests/fixtures/runtime/fake_engine.py): each
deployment's served model name picks what its engine does. Real processes, no GPU."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cohabit.runtime.engines.spec import LaunchSpec, base_url
from cohabit.runtime.interface import LaunchRequest
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.settings import Settings
from cohabit.units import GIB
from tests.e2e.engines import kill_engines
from tests.runtime.conftest import FAKE_ENGINE
from tests.service.server import serving

GATEWAY_WAIT_S = 1.0  # how long the gateway holds a request for a deployment not serving
NEVER_READY_TIMEOUT_S = 1.5  # the "never" engine's start-up timeout; every other has 30 s
# served model name → fake_engine.py arguments
MODES: dict[str, tuple[str, ...]] = {
    "exit": ("exit",),
    "oom": ("oom",),
    "never": ("never", "--lifetime", "60"),
    "serve": ("serve",),
    "slow": ("serve", "--delay", "60"),
}


def fake_llamacpp(request: LaunchRequest, port: int) -> LaunchSpec:
    """Stands in for llama.cpp's launcher: runs the fake engine in the mode its name says."""
    mode = request.served_model_name
    url = base_url(port)
    return LaunchSpec(
        engine="llamacpp",
        argv=(sys.executable, str(FAKE_ENGINE), *MODES[mode], "--port", str(port)),
        port=port,
        base_url=url,
        health_url=f"{url}/health",
        startup_timeout_s=NEVER_READY_TIMEOUT_S if mode == "never" else 30.0,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeService:
    client: httpx.Client  # base URL: the API root (…/api)
    root: str  # the server's root, where the gateway lives
    runtime: LocalRuntime
    models_dir: Path

    registered: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name

    def register(self, name: str) -> dict[str, Any]:
        """The model named `name` (a mode): the tiny GGUF written as `<name>.gguf` and
        registered under that name the first time; a name names one model."""
        if name not in self.registered:
            path = write_tiny_model(self.models_dir / f"{name}.gguf", seed=len(name))
            response = self.client.post("/models/", json={"name": name, "path": str(path)})
            assert response.status_code == 201, response.text
            self.registered[name] = response.json()
        return self.registered[name]

    def deploy(self, model_id: str, gib: int = 6) -> str:
        response = self.client.post(
            "/serving/deploy_model", json={"m_id": model_id, "vram_allocation": gib * GIB}
        )
        assert response.status_code == 202, response.text
        deployment_id: str = response.json()
        return deployment_id

    def reserved_bytes(self) -> int:
        nodes = self.client.get("/cluster/hardware").json()
        return sum(slot["reserved_bytes"] for node in nodes for slot in node["slots"])


@contextmanager
def fake_service(tmp_path: Path, *, token: str | None = None) -> Iterator[FakeService]:
    """The service on the T4 fleet (one 16 GiB card); every engine is stopped afterwards."""
    settings = Settings(
        data_dir=tmp_path / "data",
        poll_interval_s=0.05,
        lease_s=5.0,
        token=token,
        gateway_wait_s=GATEWAY_WAIT_S,
    )
    runtime = LocalRuntime(
        settings.data_dir, stop_grace_s=3.0, launchers={"llamacpp": fake_llamacpp}
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    models_dir = tmp_path / "models"
    models_dir.mkdir(exist_ok=True)
    try:
        with (
            serving(settings, runtime) as api,
            httpx.Client(base_url=api, timeout=30, headers=headers, trust_env=False) as client,
        ):
            yield FakeService(
                client=client,
                root=api.removesuffix("/api"),
                runtime=runtime,
                models_dir=models_dir,
            )
    finally:
        runtime.stop_all()
        kill_engines(settings.data_dir)
