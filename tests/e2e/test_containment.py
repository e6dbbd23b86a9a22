"""One deployment's fault never reaches the others, with real llama.cpp engines (the tiny
model on llama-cpp-python's server, on the CPU) behind the real LocalRuntime: a model whose
name holds a NUL byte (Popen's own `ValueError: embedded null byte`), and injected faults at
each step the control plane calls — start, status, stop, logs, and adopt after a restart —
each end or touch only their own deployment, while two healthy ones stay DEPLOYED and answer
chat completions through the gateway after every one.

The injected faults come from a wrapper at the runtime seam (tests/service/faulty_runtime.py);
everything inside it is real: processes, HTTP, SQLite."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from cohabit.runtime.process import group_alive
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.e2e.engines import engine_pid, kill_engines
from tests.service.faulty_runtime import FaultyRuntime, Step
from tests.service.server import T4_FLEET, serving, settings_for, wait_status

ENDED = {"ERROR", "FAILED", "MUST_REDOWNLOAD", "STOPPED"}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
READY_S = 120.0


class Service:
    """The API client and the server's root, plus what the test registers and deploys."""

    def __init__(self, client: httpx.Client, models: Path) -> None:
        self.client = client
        self.root = str(client.base_url).rstrip("/").removesuffix("/api")
        self.models = models

    def register(self, name: str) -> str:
        path = write_tiny_model(self.models / f"{len(list(self.models.iterdir()))}.gguf")
        response = self.client.post("/models/", json={"name": name, "path": str(path)})
        assert response.status_code == 201, response.text
        model_id: str = response.json()["id"]
        return model_id

    def deploy(self, model_id: str) -> str:
        body = {"m_id": model_id, "vram_allocation": 2 * GIB}
        response = self.client.post("/serving/deploy_model", json=body)
        assert response.status_code == 202, response.text
        deployment_id: str = response.json()
        return deployment_id

    def settle(self, deployment_id: str) -> dict[str, Any]:
        return wait_status(self.client, deployment_id, {"DEPLOYED", *ENDED}, timeout_s=READY_S)

    def serving_all(self, deployment_ids: list[str]) -> None:
        """Each is DEPLOYED and its engine answers a chat completion through the gateway."""
        for deployment_id in deployment_ids:
            record = self.client.get(f"/serving/deployment/{deployment_id}").json()
            assert record["status"] == "DEPLOYED", record
            reply = httpx.post(
                f"{self.root}/runtime/models/{deployment_id}/v1/chat/completions",
                json={"model": "tiny", **CHAT},
                timeout=60,
                trust_env=False,
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "data"
    kill_engines(tmp_path / "data")  # the stop-fault victim's engine, and any a failure left


@pytest.mark.slow
def test_faults_at_every_step_leave_the_other_engines_serving(
    tmp_path: Path, data_dir: Path
) -> None:
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}")
    models = tmp_path / "models"
    models.mkdir()
    faults = {f"fault-{step}": step for step in (Step.START, Step.STATUS, Step.STOP, Step.LOGS)}
    runtime = FaultyRuntime(LocalRuntime(data_dir, stop_grace_s=3.0), faults)
    with (
        serving(settings, runtime, T4_FLEET) as api,
        httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
    ):
        service = Service(client, models)
        tiny = service.register("tiny")
        healthy = [service.deploy(tiny) for _ in range(3)]  # the third is adopt's victim
        for deployment_id in healthy:
            assert service.settle(deployment_id)["status"] == "DEPLOYED"
        service.serving_all(healthy)

        # A NUL byte in a model's name, written past the API's checks: Popen itself refuses.
        nul = service.register("nul")
        db = Database(settings.resolved_database_url)
        with db.engine.begin() as connection:
            rename = text("UPDATE models SET name = :name WHERE id = :id")
            connection.execute(rename, {"name": "t\x00x", "id": nul})
        db.dispose()
        record = service.settle(service.deploy(nul))
        assert (record["status"], record["last_error_code"]) == ("ERROR", "RUNTIME_ERROR")
        assert record["last_error_message"].endswith(": embedded null byte")
        assert record["last_error_at"] is not None
        service.serving_all(healthy)

        for step in (Step.START, Step.STATUS):
            victim = service.deploy(service.register(f"fault-{step}"))
            record = service.settle(victim)
            assert (record["status"], record["last_error_code"]) == ("ERROR", "RUNTIME_ERROR")
            message = f"InjectedFault: injected {step} fault for {victim}"
            assert (record["last_error_message"], bool(record["last_error_at"])) == (message, True)
            pid = engine_pid(data_dir, victim)
            assert (pid is None) is (step is Step.START)  # a status fault stops its engine
            assert pid is None or not group_alive(pid)
            service.serving_all(healthy)

        victim = service.deploy(service.register(f"fault-{Step.LOGS}"))
        assert service.settle(victim)["status"] == "DEPLOYED"
        logs = client.get(f"/serving/deployment/{victim}/logs").json()["logs"]
        assert logs == [f"(logs unavailable: InjectedFault: injected logs fault for {victim})"]
        assert client.get(f"/serving/deployment/{healthy[0]}/logs").json()["logs"]
        assert client.delete(f"/serving/deployment/{victim}").json() is True

        victim = service.deploy(service.register(f"fault-{Step.STOP}"))
        assert service.settle(victim)["status"] == "DEPLOYED"
        assert client.delete(f"/serving/deployment/{victim}").json() is True
        assert client.get(f"/serving/deployment/{victim}/status").json() == "STOPPED"
        assert (Step.STOP, victim) in runtime.raised
        service.serving_all(healthy)

    # A restart: the new server adopts every engine still running; adopting one raises.
    adopted = healthy[2]
    runtime = FaultyRuntime(LocalRuntime(data_dir, stop_grace_s=3.0), {adopted: Step.ADOPT})
    with (
        serving(settings, runtime, T4_FLEET) as api,
        httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
    ):
        service = Service(client, models)
        record = wait_status(client, adopted, ENDED, timeout_s=READY_S)
        assert (record["status"], record["last_error_message"]) == (
            "ERROR",
            f"InjectedFault: injected adopt fault for {adopted}",
        )
        pid = engine_pid(data_dir, adopted)
        # The record ends first, then its engine is stopped (SIGTERM, then SIGKILL after the
        # runtime's 3 s grace): it must be gone well within that.
        assert pid is not None
        deadline = time.monotonic() + 10
        while group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(pid)  # its engine did not outlive it
        service.serving_all(healthy[:2])
        for deployment_id in healthy[:2]:
            assert client.delete(f"/serving/deployment/{deployment_id}").json() is True
