"""More models than fit, with real llama.cpp engines: a simulated 16 GiB card and three tiny
models (written here) deployed at 6 GiB each with `min_copies: 0`, admitted unloaded. Chat
requests go round the three through /v1 by model name; the gateway holds a request for an
unloaded model while it loads, and the load unloads the least recently used idle one to make
room. Every reply succeeds, a sampler counting the engine processes the operating system
runs (by their marks) never sees more than two, and the one unloaded is each time the one
used longest ago (the order of use differs from the order of loading)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.store import events
from cohabit.store.database import Database
from cohabit.units import GIB
from tests.e2e.engines import kill_engines, marked_engines
from tests.service.server import T4_FLEET, serving, settings_for, wait_status

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
ORDER = ["tiny-a", "tiny-b", "tiny-a", "tiny-c", "tiny-b", "tiny-a"]
READY_S = 120.0


class ProcessCounter:
    """Counts the live engine processes every few milliseconds on a thread; keeps the most."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessCounter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            running = sum(len(pids) for pids in marked_engines(self.data_dir).values())
            self.most = max(self.most, running)
            self._stop.wait(0.02)


def test_three_models_round_robin_on_room_for_two(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'cohabit.db'}"
    settings = settings_for(tmp_path, database_url)
    data_dir = settings.data_dir
    runtime = LocalRuntime(data_dir, stop_grace_s=5.0)
    names = ("tiny-a", "tiny-b", "tiny-c")
    try:
        with (
            serving(settings, runtime, T4_FLEET) as api,
            httpx.Client(base_url=api, timeout=60, trust_env=False) as client,
            ProcessCounter(data_dir) as counter,
        ):
            root = api.removesuffix("/api")
            db = Database(database_url)
            ids: dict[str, str] = {}
            for name in names:
                path = write_tiny_model(tmp_path / f"{name}.gguf")
                model = client.post("/models/", json={"name": name, "path": str(path)})
                assert model.status_code == 201, model.text
                body = {
                    "m_id": model.json()["id"],
                    "vram_allocation": 6 * GIB,
                    "min_copies": 0,
                    "starting_copies": 0,
                }
                answer = client.post("/serving/deploy_model", json=body)
                assert answer.status_code == 202, answer.text
                ids[name] = answer.json()
                assert wait_status(client, ids[name], {"UNLOADED"})["status"] == "UNLOADED"
            last_use: dict[str, float] = {}
            for name in ORDER:
                loaded = {n for n in names if status(client, ids[n]) == "DEPLOYED"}
                expected_victim = None
                if name not in loaded and len(loaded) == 2:
                    expected_victim = min(loaded, key=lambda n: last_use[n])
                reply = client.post(
                    f"{root}/v1/chat/completions", json={"model": name, **CHAT}, timeout=READY_S
                )
                assert reply.status_code == 200, reply.text
                assert reply.json()["choices"][0]["message"]["content"] is not None
                last_use[name] = time.monotonic()
                now_loaded = {n for n in names if status(client, ids[n]) == "DEPLOYED"}
                assert now_loaded == (loaded - {expected_victim}) | {name}
                if expected_victim is not None:
                    unloaded = events.since(db, ids[expected_victim])[-1]
                    assert unloaded.message == f"unloaded: preempted by {name} (priority 0)"
                time.sleep(0.05)  # uses a clear moment apart
            assert counter.most == 2, counter.most
            db.dispose()
    finally:
        kill_engines(data_dir)


def status(client: httpx.Client, deployment_id: str) -> Any:
    return client.get(f"/serving/deployment/{deployment_id}").json()["status"]
