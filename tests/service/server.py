"""Run the real app on a loopback port inside the test process (uvicorn on a thread), so tests
speak real HTTP while injecting the runtime double; and wait for deployment statuses."""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from cohabit.hardware.model import Fleet
from cohabit.runtime.interface import EngineRuntime
from cohabit.service.app import Backend, create_app
from cohabit.service.httpserver import server_options
from cohabit.service.settings import KEEP_ALIVE_S, Settings
from tests.estimate.tinymodels import write_gguf_model
from tests.placement.fleets import fleet, gpu, node
from tests.service.scripted_runtime import ScriptedRuntime

T4_FLEET = fleet(node("node-a", gpu(0, 16, product="Tesla T4", uuid="GPU-t4-0")))
TERMINAL = {"DEPLOYED", "FAILED", "ERROR", "STOPPED", "MUST_REDOWNLOAD"}


def settings_for(tmp_path: Path, database_url: str, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        poll_interval_s=0.05,
        lease_s=2.0,
        **extra,
    )


@contextmanager
def serving(
    settings: Settings, runtime: EngineRuntime, fleet: Fleet = T4_FLEET, **options: Any
) -> Iterator[str]:
    """The app on 127.0.0.1 (a free port); yields the API root URL (…/api). `options` go
    to its `Backend` (e.g. `measure`)."""
    backend = Backend(runtime=runtime, fleet=fleet, **options)
    with serving_app(create_app(settings, backend)) as api:
        yield api


@contextmanager
def serving_as_cli(
    settings: Settings, runtime: EngineRuntime, fleet: Fleet = T4_FLEET
) -> Iterator[str]:
    """`serving`, with uvicorn run as `cohabit serve` runs it (`httpserver.server_options`:
    uvloop, and the protocol with its deadlines and connection cap, sized for this process's
    open-files limit); yields the API root URL (…/api)."""
    app = create_app(settings, Backend(runtime=runtime, fleet=fleet))
    open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    with serving_app(app, **server_options(settings, open_files=open_files)) as api:
        yield api


@contextmanager
def serving_app(app: FastAPI, **uvicorn_options: Any) -> Iterator[str]:
    """`app` on 127.0.0.1 (a free port); yields the API root URL (…/api). `uvicorn_options`
    go to `uvicorn.Config` (what `cohabit serve` runs it with: `httpserver.server_options`)."""
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and
    # Nagle against delayed ACKs holds every small keep-alive answer back ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # cohabit serve's keep-alive unless told otherwise: uvicorn's own 5 s closed a client's
    # kept connection as it sent its next request, on a machine slow enough to pause 5 s.
    uvicorn_options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", **uvicorn_options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/api"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@contextmanager
def scripted_client(tmp_path: Path, database_url: str) -> Iterator[httpx.Client]:
    """A server with the scripted engine double, and an HTTP client on its API root."""
    settings = settings_for(tmp_path, database_url)
    with (
        serving(settings, ScriptedRuntime()) as api,
        httpx.Client(base_url=api, timeout=30) as http,
    ):
        yield http


def wait_for(check: Callable[[], Any], *, timeout_s: float = 20.0, interval_s: float = 0.05) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {check}")
        time.sleep(interval_s)


def wait_status(
    client: httpx.Client, deployment_id: str, wanted: set[str] | None = None, **kw: Any
) -> dict[str, Any]:
    wanted = wanted or TERMINAL

    def check() -> dict[str, Any] | None:
        record: dict[str, Any] = client.get(f"/serving/deployment/{deployment_id}").json()
        return record if record["status"] in wanted else None

    result: dict[str, Any] = wait_for(check, **kw)
    return result


def register_tiny_gguf(client: httpx.Client, tmp_path: Path, name: str = "tiny") -> dict[str, Any]:
    """Write a tiny GGUF and register it; returns the model body."""
    path = tmp_path / f"{name}.gguf"
    write_gguf_model(path)
    response = client.post("/models/", json={"name": name, "path": str(path)})
    assert response.status_code == 201, response.text
    model: dict[str, Any] = response.json()
    return model


def deploy(client: httpx.Client, model_id: str, **body: Any) -> httpx.Response:
    return client.post("/serving/deploy_model", json={"m_id": model_id, **body})
