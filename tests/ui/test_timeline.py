"""A deployment's details show its timeline, in headless Chromium against a real `cohabit serve
--fleet` on one Tesla T4 whose engines are real llama.cpp servers of the tiny GGUF: requested,
placed (where and why), reserved, started, the engine's load milestones from its log
(engine_imported, weights_loaded), healthy; stopping it from the details adds
`stopped` while the view is open. What the records hold is shown as text: a model named like
markup stays text."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, expect

from cohabit.runtime.tinymodel import write_tiny_model
from tests.ui.conftest import GIB, Server, open_page

MARKUP = '<img src=x onerror="window.pwned=1">tiny'


def test_the_details_show_the_timeline_and_its_end(
    browser: Browser, one_t4: Server, tmp_path: Path
) -> None:
    path = write_tiny_model(tmp_path / "markup.gguf")
    model = one_t4.client.post("/models/", json={"name": MARKUP, "path": str(path)}).json()
    body = {"m_id": model["id"], "vram_allocation": 2 * GIB}
    deployment_id = str(one_t4.client.post("/serving/deploy_model", json=body).json())
    one_t4.wait_status(deployment_id, "DEPLOYED")
    page = open_page(browser, one_t4)
    try:
        page.locator(f"#row-{deployment_id} a").click()
        steps = page.locator("#details-body .timeline li")
        expect(steps).to_have_count(7)
        kinds = [steps.nth(i).get_attribute("data-kind") for i in range(7)]
        assert kinds == [
            "requested", "placed", "reserved", "started", "engine_imported", "weights_loaded",
            "healthy",
        ]  # fmt: skip
        expect(steps.nth(0)).to_contain_text(f"{MARKUP} on llamacpp: 2 GiB per device")
        expect(steps.nth(1)).to_contain_text(
            "on node-a gpu 0: binpack: the tightest fit, leaving 14 GiB of 16 GiB free"
        )
        expect(steps.nth(2)).to_contain_text("holds 2 GiB on node-a gpu 0")
        expect(steps.nth(3)).to_contain_text("llamacpp engine started: pid ")
        expect(steps.nth(4)).to_contain_text("llama_model_loader: loaded meta data with ")
        expect(steps.nth(5)).to_contain_text("llama_context: constructing llama_context")
        expect(steps.nth(6)).to_contain_text("s after it was requested")
        expect(steps.nth(6)).to_contain_text("engine_import ")
        assert page.locator("#details-body img").count() == 0
        assert page.evaluate("window.pwned") is None

        page.once("dialog", lambda dialog: dialog.accept())
        page.locator(f'#details-body button[data-stop="{deployment_id}"]').click()
        expect(steps).to_have_count(8)
        expect(steps.nth(7)).to_have_attribute("data-kind", "stopped")
        expect(steps.nth(7)).to_contain_text(
            "stopped by anonymous through the API (was DEPLOYED); its budget is released"
        )
    finally:
        page.close()
        one_t4.client.delete(f"/serving/deployment/{deployment_id}")
