"""A deployment of two copies on the web page, in headless Chromium against a real `cohabit
serve --fleet` on two Tesla T4s whose engines are real llama.cpp servers of the tiny GGUF:
the row says how many copies serve and where each runs, the fleet map draws each copy's
budget on its own GPU as its deployment's (its colour, linked to it), and the details list
every copy with its device, process and engine; a deployment waiting for room shows its
place in the queue."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.ui.conftest import GIB, Server, open_page, serve

TWO_T4 = (
    "nodes:\n  - name: node-a\n    gpus:\n"
    "      - {index: 0, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: '12.4'}\n"
    "      - {index: 1, vendor: nvidia, product: Tesla T4, memory: 16GiB, accel_version: '12.4'}\n"
)


@pytest.fixture(scope="module")
def two_t4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve(tmp_path_factory.mktemp("two-t4"), TWO_T4)


def two_copies(server: Server) -> dict[str, Any]:
    """Two copies of 15 GiB: each fills one card."""
    body = {"m_id": server.model_id, "vram_allocation": 15 * GIB, "starting_copies": 2}
    response = server.client.post("/serving/deploy_model", json=body)
    assert response.status_code == 202, response.text
    deployment_id = str(response.json())
    record: dict[str, Any] = server.wait_status(deployment_id, "DEPLOYED")
    while record["ready_copies"] < 2:  # DEPLOYED once the first copy serves
        record = server.wait_status(deployment_id, "DEPLOYED")
    return record


def test_the_page_shows_every_copy_and_its_device(browser: Browser, two_t4: Server) -> None:
    record = two_copies(two_t4)
    deployment_id = record["id"]
    places = {
        i["extra_details"]["copy_index"]: f"node-a gpu {i['extra_details']['gpu_indices'][0]}"
        for i in record["instances"]
    }
    assert set(places.values()) == {"node-a gpu 0", "node-a gpu 1"}  # spread over the cards
    body = {"m_id": two_t4.model_id, "vram_allocation": 2 * GIB, "queue": True}
    waiting = str(two_t4.client.post("/serving/deploy_model", json=body).json())
    two_t4.wait_status(waiting, "QUEUED")
    page = open_page(browser, two_t4)
    try:
        row = page.locator(f"#row-{deployment_id}")
        expect(row.locator("td.copies")).to_have_text("2/2")
        lines = row.locator(".copy-places li")
        expect(lines).to_have_count(2)
        assert lines.all_inner_texts() == [f"copy {i} · {places[i]}" for i in (0, 1)]
        # Its endpoint is the gateway's path (token checked, copies chosen there), never an
        # engine's own port.
        expect(row.locator("td code")).to_have_text(f"/runtime/models/{deployment_id}/v1")
        engine_urls = [i["extra_details"]["base_url"] for i in record["instances"]]
        assert len(engine_urls) == 2 and all(engine_urls)

        # Each card holds one copy's budget, drawn as the deployment's and linked to it.
        segments = page.locator(f'.seg-held[data-deployment="{deployment_id}"]')
        expect(segments).to_have_count(2)
        labels = sorted(segments.all_inner_texts())
        assert labels == ["tiny-chat 15 GiB", "tiny-chat copy 1 15 GiB"]
        hues = {s.get_attribute("style") for s in segments.all()}
        assert len({re.sub(r"width: [^;]+;", "", h or "") for h in hues}) == 1
        for index in (0, 1):
            gpu = places[index].removeprefix("node-a gpu ")
            bar = page.locator(f"#slot-node-a-{gpu} .seg-held")
            expect(bar).to_contain_text("copy 1" if index else "tiny-chat 15 GiB")
        # The one waiting for room says where it stands.
        expect(page.locator(f"#row-{waiting} .queued")).to_have_text("queued #1")

        row.locator("a").click()
        copies = page.locator("#details-body .copies-table tbody tr")
        expect(copies).to_have_count(2)
        for index in (0, 1):
            line = copies.nth(index)
            expect(line).to_have_attribute("data-copy", str(index))
            expect(line).to_have_attribute("data-status", "DEPLOYED")
            expect(line).to_contain_text(places[index])
            instance = next(
                i for i in record["instances"] if i["extra_details"]["copy_index"] == index
            )
            expect(line).to_contain_text(f"pid {instance['container_id']}")
        details = page.locator("#details-body")
        expect(details.locator("dd code")).to_have_text(f"/runtime/models/{deployment_id}/v1")
        # (The engine's own log lines, shown below, may name its port; nothing else does.)
        shown = [
            page.locator(f"#row-{deployment_id}").inner_text(),
            details.locator("dl.fields").inner_text(),
            details.locator(".copies-table").inner_text(),
        ]
        assert not [url for url in engine_urls for text in shown if url in text], shown
    finally:
        page.close()
        two_t4.client.delete(f"/serving/deployment/{waiting}")
        two_t4.client.delete(f"/serving/deployment/{deployment_id}")
