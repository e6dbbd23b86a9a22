"""The web page in headless Chromium against a real `cohabit serve --fleet` on one Tesla T4
(16 GiB): two deployments share the card and the map draws each as its share of the bar; a
deploy through the form that cannot fit shows `insufficient_capacity` and the largest free
budget; stopping a deployment, from the table or from its details, frees its part of the bar.

The module's server holds two deployments, 6 GiB and 4 GiB, for every test; tests that add
deployments stop them again, so each test sees those two and 6 GiB free."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect

from tests.ui.conftest import LAPTOP, NARROW, Server, open_page

BAR = "#slot-node-a-0 .bar"
TOLERANCE_PX = 1.5


@pytest.fixture(scope="module")
def shared(one_t4: Server) -> tuple[Server, str, str]:
    """The T4 holding a 6 GiB and a 4 GiB deployment, both DEPLOYED."""
    big, small = one_t4.deploy(6), one_t4.deploy(4)
    one_t4.wait_status(big, "DEPLOYED")
    one_t4.wait_status(small, "DEPLOYED")
    return one_t4, big, small


def assert_width(page: Page, segment: Locator, gib: float, card_gib: float = 16) -> None:
    """The segment is `gib` of the card's bar wide (to a pixel and a half), and says so."""
    bar_px = float(page.locator(BAR).evaluate("el => el.clientWidth"))
    box = segment.bounding_box()
    assert box is not None, "segment not drawn"
    assert abs(box["width"] - gib / card_gib * bar_px) <= TOLERANCE_PX, (box, bar_px)
    assert f"{gib:g} GiB" in segment.inner_text()


@pytest.mark.parametrize("viewport", [LAPTOP, NARROW], ids=["laptop", "narrow-window"])
def test_two_deployments_share_one_gpu_with_the_right_widths(
    browser: Browser, shared: tuple[Server, str, str], viewport: ViewportSize
) -> None:
    server, big, small = shared
    page = open_page(browser, server, viewport)
    try:
        bar = page.locator(BAR)
        expect(bar.locator(".seg-held")).to_have_count(2)
        assert_width(page, bar.locator(f'[data-deployment="{big}"]'), 6)
        assert_width(page, bar.locator(f'[data-deployment="{small}"]'), 4)
        assert_width(page, bar.locator(".seg-free"), 6)
        expect(page.locator("#slot-node-a-0 .chip").first).to_have_text("software_shared")
        rows = page.locator("#deployments tbody tr")
        expect(rows.locator(".status-ok")).to_have_count(2)
        expect(page.locator(f"#row-{big}")).to_contain_text("node-a gpu 0")
        # A narrow window stacks the panels instead of scrolling the page sideways.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0
    finally:
        page.close()


def test_a_deploy_that_cannot_fit_shows_insufficient_capacity_and_the_largest_free_budget(
    browser: Browser, shared: tuple[Server, str, str]
) -> None:
    """A million tokens of context makes the tiny model need ~8 GiB; 6 GiB is free."""
    server, _big, _small = shared
    page = open_page(browser, server)
    try:
        page.locator("#f-ctx").fill("1000000")
        page.locator("#f-ctx").press("Tab")  # commits the value: a change event
        verdict = page.locator("#preview .verdict-bad")
        expect(verdict).to_contain_text("insufficient_capacity")
        expect(verdict.locator(".largest")).to_contain_text(
            "Largest free budget: 6 GiB on node-a gpu 0"
        )
        expect(page.locator("#preview")).to_contain_text("1,000,000 tokens")
        # Deploying anyway records the NoFit on the deployment, and its details show the fix.
        page.locator("#f-deploy").click()
        details = page.locator("#details-body")
        expect(details.locator(".error-code")).to_have_text("NoFitError", timeout=20_000)
        expect(details.locator(".error-message")).to_contain_text("insufficient_capacity")
        expect(details).to_contain_text("6 GiB on node-a gpu 0")
        expect(details.locator(".fix")).to_contain_text("reduce the context length")
        expect(details.locator(".status")).to_have_text("FAILED")
        expect(page.locator(f"{BAR} .seg-held")).to_have_count(2)  # nothing was reserved
    finally:
        page.close()


def test_stopping_from_the_table_frees_its_bar(
    browser: Browser, shared: tuple[Server, str, str]
) -> None:
    server, _big, _small = shared
    extra = server.deploy(2)
    server.wait_status(extra, "DEPLOYED")
    page = open_page(browser, server)
    try:
        segment = page.locator(f'{BAR} [data-deployment="{extra}"]')
        expect(segment).to_have_count(1)
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator(f'#row-{extra} button[data-stop="{extra}"]').click()
        expect(segment).to_have_count(0)
        expect(page.locator(f"#row-{extra} .status")).to_have_text("STOPPED")
        free = page.locator(f"{BAR} .seg-free")
        expect(free).to_contain_text("free 6 GiB")
        assert_width(page, free, 6)
    finally:
        page.close()
        server.client.delete(f"/serving/deployment/{extra}")


def test_stopping_from_the_details_view_with_the_keyboard_frees_its_bar(
    browser: Browser, shared: tuple[Server, str, str]
) -> None:
    server, _big, _small = shared
    extra = server.deploy(3)
    server.wait_status(extra, "DEPLOYED")
    page = open_page(browser, server)
    try:
        segment = page.locator(f'{BAR} [data-deployment="{extra}"]')
        expect(segment).to_have_count(1)
        page.locator(f"#row-{extra} a").focus()
        page.keyboard.press("Enter")  # opens the details; focus moves to their heading
        details = page.locator("#details-body")
        expect(details.locator(".status")).to_have_text("DEPLOYED")
        expect(details).to_contain_text("allocated_bytes")
        expect(details).to_contain_text("software_shared")
        stop = details.locator(f'button[data-stop="{extra}"]')
        page.keyboard.press("Tab")  # past "Close"
        page.keyboard.press("Tab")
        expect(stop).to_be_focused()
        page.once("dialog", lambda dialog: dialog.accept())
        page.keyboard.press("Enter")
        expect(segment).to_have_count(0)
        expect(details.locator(".status")).to_have_text("STOPPED")
    finally:
        page.close()
        server.client.delete(f"/serving/deployment/{extra}")
