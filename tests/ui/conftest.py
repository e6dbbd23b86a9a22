"""The web page's tests drive headless Chromium (Debian's `chromium`, through Playwright's
Python package) against a real `cohabit serve --fleet` process whose engines are real
llama.cpp servers of the tiny GGUF on this CPU. `.ci/run` installs Chromium when missing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, sync_playwright

from cohabit.runtime.tinymodel import write_tiny_model
from tests.cli.test_serve import _alive, cohabit_serve

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GIB = 1 << 30
# One Tesla T4 (16 GiB): the deployments of a module share it.
ONE_T4 = (
    "nodes:\n  - name: node-a\n    gpus:\n"
    "      - {index: 0, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: '12.4'}\n"
)
LAPTOP: ViewportSize = {"width": 1366, "height": 768}
NARROW: ViewportSize = {"width": 420, "height": 900}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Server:
    """A running `cohabit serve`: its root URL and an API client, plus the helpers the tests
    share (register the tiny model, deploy with a fixed budget, wait for a status)."""

    def __init__(self, root: str, client: httpx.Client, model_path: Path) -> None:
        self.root = root
        self.client = client
        self.model_path = model_path
        self._model_id: str | None = None

    @property
    def model_id(self) -> str:
        if self._model_id is None:
            response = self.client.post(
                "/models/", json={"name": "tiny-chat", "path": str(self.model_path)}
            )
            assert response.status_code == 201, response.text
            self._model_id = str(response.json()["id"])
        return self._model_id

    def deploy(self, budget_gib: float) -> str:
        """Deploy the tiny model holding `budget_gib` per device (vram_allocation); its id."""
        body = {"m_id": self.model_id, "vram_allocation": int(budget_gib * GIB)}
        response = self.client.post("/serving/deploy_model", json=body)
        assert response.status_code == 202, response.text
        return str(response.json())

    def wait_status(self, deployment_id: str, *wanted: str, timeout_s: float = 120) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.client.get(f"/serving/deployment/{deployment_id}").json()
            if record["status"] in wanted:
                return record
            assert record["status"] not in ("FAILED", "ERROR"), record["last_error_message"]
            assert time.monotonic() < deadline, f"still {record['status']} after {timeout_s} s"
            time.sleep(0.2)

    def stop_all(self) -> None:
        """Stop every deployment and wait for its engine to go (killed after 30 s)."""
        pids = []
        for record in self.client.get("/serving/deployments").json():
            pids += [int(i["container_id"]) for i in record["instances"] if i["container_id"]]
            self.client.delete(f"/serving/deployment/{record['id']}")
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def serve(tmp_path: Path, fleet: str, *args: str) -> Iterator[Server]:
    """`cohabit serve --fleet` on a free port; every deployment is stopped before it exits,
    so no engine outlives the test."""
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    with (
        cohabit_serve(tmp_path, fleet, *args) as (api, _process),
        httpx.Client(base_url=api, timeout=30) as client,
    ):
        server = Server(api.removesuffix("/api"), client, model_path)
        try:
            yield server
        finally:
            server.stop_all()


@pytest.fixture(scope="module")
def one_t4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(tmp_path_factory.mktemp("one-t4"), ONE_T4)


def open_page(browser: Browser, server: Server, viewport: ViewportSize = LAPTOP) -> Page:
    """A fresh page on the server's root, with the fleet map drawn; fails on script errors."""
    page = browser.new_page(viewport=viewport)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(server.root + "/")
    page.wait_for_selector(".node")
    assert errors == []
    return page
