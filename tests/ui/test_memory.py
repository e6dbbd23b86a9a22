"""Measured memory on the web page, in headless Chromium against a real server on this
machine's CPU pool (no fleet file: the meter reads it) with a real llama.cpp engine of the
tiny GGUF: the pool's bar has a measured line under its reservations — what cohabit's engine
uses and what the rest of the machine holds —, and the deployment's row a sparkline of its
memory against its budget once the meter has two samples."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect

from cohabit.hardware.host import discover_host
from cohabit.hardware.model import Fleet
from cohabit.runtime.spawner import LocalRuntime
from cohabit.runtime.tinymodel import write_tiny_model
from cohabit.service.api.ui.views import SPARK_HEIGHT, SPARK_WIDTH
from tests.service.server import serving, settings_for
from tests.ui.conftest import GIB, Server, open_page


@pytest.fixture
def metered(tmp_path: Path) -> Iterator[Server]:
    fleet = Fleet(nodes=(replace(discover_host(), os_reserve_bytes=GIB),))
    settings = settings_for(tmp_path, f"sqlite:///{tmp_path / 'cohabit.db'}", meter_interval_s=0.3)
    runtime = LocalRuntime(tmp_path / "data", startup_timeout_s=90)
    model_path = write_tiny_model(tmp_path / "tiny.gguf")
    try:
        with (
            serving(settings, runtime, fleet=fleet) as api,
            httpx.Client(base_url=api, timeout=30) as client,
        ):
            yield Server(api.removesuffix("/api"), client, model_path)
    finally:
        runtime.stop_all()


def test_the_pool_bar_and_the_row_show_measured_memory(browser: Browser, metered: Server) -> None:
    deployment_id = metered.deploy(1)
    metered.wait_status(deployment_id, "DEPLOYED")
    page = open_page(browser, metered)
    try:
        meter = page.locator(".slot .meter")
        expect(meter).to_have_count(1, timeout=15_000)
        used = page.locator(".slot .meter .seg-used")
        foreign = page.locator(".slot .meter .seg-foreign")
        # The engine's memory shows once a sample has attributed it (the page polls).
        expect(used).not_to_have_attribute("data-bytes", "0", timeout=15_000)
        used_bytes = int(used.get_attribute("data-bytes") or 0)
        foreign_bytes = int(foreign.get_attribute("data-bytes") or 0)
        total = int(page.locator(".slot .bar").get_attribute("data-total-bytes") or 0)
        assert 0 < used_bytes <= GIB  # a tiny model's engine, inside its 1 GiB budget
        assert foreign_bytes > 0 and used_bytes + foreign_bytes <= total  # the rest of the host
        label = meter.get_attribute("aria-label") or ""
        assert "used by cohabit's engines" in label and "held outside cohabit" in label
        assert meter.bounding_box() is not None  # drawn, not only in the markup

        spark = page.locator(f"#row-{deployment_id} svg.spark")
        expect(spark).to_have_count(1, timeout=15_000)
        points = spark.locator("polyline").get_attribute("points") or ""
        pairs = [tuple(map(float, p.split(","))) for p in points.split()]
        assert len(pairs) >= 2
        assert pairs[0][0] == 0 and pairs[-1][0] == pytest.approx(SPARK_WIDTH)
        # y is used over budget: a tiny engine in a 1 GiB budget sits in the lower part.
        assert all(0 <= y <= SPARK_HEIGHT for _x, y in pairs)
        assert all(y > SPARK_HEIGHT / 2 for _x, y in pairs)
        assert re.search(r"last \d+ samples", spark.get_attribute("aria-label") or "")
    finally:
        page.close()
