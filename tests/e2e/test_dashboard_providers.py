"""The Providers and routes page in a real Chromium on both backends: add providers (one on the
built-in simulator, one whose model always answers 503), check both, edit prices and timeouts,
build a route with two links and reorder them, watch the failing provider's breaker open after
a call falls back, and see a viewer get the page read-only."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, Page, expect

from bullpen.domain.access import Role
from tests.support.browser import CSP_PROBE, TIMEOUT_MS, PageErrors
from tests.support.dashboard_checks import clean, sign_in
from tests.support.login import add_user

pytestmark = [pytest.mark.browser]

KEY = "sk-dash-CANARY-7c1d9e2f0a3b"  # pragma: allowlist secret
PASSWORD = "a long enough viewer password"  # pragma: allowlist secret


async def api(http: aiohttp.ClientSession, server: Any, path: str) -> Any:
    async with http.get(f"{server.base_url}/api/v1{path}", headers=server.auth) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def add_provider(page: Page, name: str, base_url: str, models: str, key: str = "") -> None:
    await page.locator("summary", has_text="Add a provider").click()
    form = page.get_by_role("form", name="Add a provider")
    await form.get_by_label("Name", exact=True).fill(name)
    await form.get_by_label("Base URL").fill(base_url)
    await form.get_by_label("API key").fill(key)
    await form.get_by_label("Models").fill(models)
    await form.get_by_role("button", name="Add provider").click()


def chain_of(page: Page, route: str) -> Any:
    return page.locator(f'section[data-route="{route}"] ol.chain > li .link-text')


@pytest.mark.with_settings(gateway_breaker_failures=1)
async def test_providers_page_adds_checks_edits_routes_and_shows_breakers(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    sim = server.services.simulator
    assert sim is not None
    await sign_in(page, server)
    await page.get_by_role("link", name="Providers").click()
    await expect(page).to_have_url(f"{server.base_url}/providers")
    builtin = page.locator('#providers tr[data-provider="simulated"]')
    await expect(builtin).to_contain_text("built-in")
    await expect(page.locator("#breaker-note")).to_contain_text("this server process")

    # A name the API refuses: its message, and the form keeps what was typed.
    await add_provider(page, "bad name", sim.base_url, "sim-1 0.5 1.5", KEY)
    await expect(page.get_by_role("alert")).to_contain_text("name: String should match pattern")
    form = page.get_by_role("form", name="Add a provider")
    await expect(form.get_by_label("Base URL")).to_have_value(sim.base_url)
    await expect(form.get_by_label("API key")).to_have_value("")  # never filled back in

    await form.get_by_label("Name", exact=True).fill("good")
    await form.get_by_label("API key").fill(KEY)
    await form.get_by_label("Connect").fill("3")
    await form.get_by_role("button", name="Add provider").click()
    await expect(page).to_have_url(f"{server.base_url}/providers")
    good = page.locator('#providers tr[data-provider="good"]')
    await expect(good.locator(".key")).to_have_text("sk-…0a3b")
    await expect(good).to_contain_text("sim-1 0.5 / 1.5 / 0.5")
    assert KEY not in await page.content()
    await add_provider(page, "flaky", sim.base_url, "sim-1@503")
    flaky = page.locator('#providers tr[data-provider="flaky"]')
    await expect(flaky.locator(".key")).to_have_text("none")

    # Check both: one answers, one fails with its reason.
    await good.get_by_role("button", name="Check good").click()
    result = page.locator(".check-result")
    await expect(result).to_contain_text(
        re.compile(r"Check of good: OK\. sim-1 answered in \d+ ms")
    )
    await (
        page.locator('#providers tr[data-provider="flaky"]')
        .get_by_role("button", name="Check flaky")
        .click()
    )
    await expect(page.get_by_role("alert")).to_contain_text(
        "Check of flaky failed (502 provider, reason http-503)"
    )
    assert KEY not in await page.content()
    await clean(page, page_errors, 409, 422, 502)

    # Edit prices and timeouts on the provider's page; the key is kept.
    await page.locator('#providers tr[data-provider="good"] a').click()
    edit = page.get_by_role("form", name="Edit good")
    await edit.get_by_label("Models").fill("sim-1 2 8 1")
    await edit.get_by_label("First token").fill("7")
    await edit.get_by_role("button", name="Save").click()
    await expect(page).to_have_url(re.compile(r"/providers/[0-9a-f-]{36}$"))
    await expect(page.locator("p.meta").first).to_contain_text("key sk-…0a3b")
    await clean(page, page_errors, 409, 422, 502)
    async with aiohttp.ClientSession() as http:
        listed = {p["name"]: p for p in (await api(http, server, "/providers"))["items"]}
        assert listed["good"]["models"] == [
            {
                "name": "sim-1",
                "input_per_mtok": 2.0,
                "cached_input_per_mtok": 1.0,
                "output_per_mtok": 8.0,
            }
        ]
        assert listed["good"]["timeouts"]["ttft_s"] == 7.0
        assert listed["good"]["timeouts"]["connect_s"] == 3.0
        assert listed["good"]["api_key_hint"] == "sk-…0a3b"  # pragma: allowlist secret

        # A route with two links, the failing one first; reorder it both ways.
        await page.goto("/providers")
        await page.locator("summary", has_text="Add a model route").click()
        new_route = page.get_by_role("form", name="Add a model route")
        await new_route.get_by_label("Route name").fill("smart")
        await new_route.get_by_label("Links").fill("flaky/sim-1@503\ngood/sim-1")
        await new_route.get_by_role("button", name="Add route").click()
        await expect(chain_of(page, "smart")).to_have_text(["flaky/sim-1@503", "good/sim-1"])
        await page.get_by_role("button", name="Move up good/sim-1 in smart").click()
        await expect(chain_of(page, "smart")).to_have_text(["good/sim-1", "flaky/sim-1@503"])
        routes = (await api(http, server, "/model-routes"))["items"]
        assert [link["provider"] for link in routes[0]["chain"]] == ["good", "flaky"]
        await page.get_by_role("button", name="Move down good/sim-1 in smart").click()
        await expect(chain_of(page, "smart")).to_have_text(["flaky/sim-1@503", "good/sim-1"])
        routes = (await api(http, server, "/model-routes"))["items"]
        assert [link["provider"] for link in routes[0]["chain"]] == ["flaky", "good"]

        # A call through the route falls back; the failing provider's breaker opens.
        call = {"model": "smart", "messages": [{"role": "user", "content": "Say hello"}]}
        async with http.post(
            f"{server.base_url}/v1/chat/completions", json=call, headers=server.auth
        ) as resp:
            assert resp.status == 200, await resp.text()
    await page.goto("/providers")
    flaky = page.locator('#providers tr[data-provider="flaky"] .breaker')
    await expect(flaky.locator(".status")).to_have_text("open")
    await expect(flaky).to_contain_text(
        re.compile(r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, skipped until")
    )
    good_breaker = page.locator('#providers tr[data-provider="good"] .breaker')
    await expect(good_breaker.locator(".status")).to_have_text("closed")
    await clean(page, page_errors, 409, 422, 502)

    # A provider a route uses cannot go: the API's 409, after a confirmation.
    await page.locator('#providers tr[data-provider="flaky"] a').click()
    await page.get_by_role("button", name="Delete").click()
    await expect(page.get_by_role("alertdialog")).to_contain_text("Delete flaky?")
    await page.get_by_role("button", name="Yes, delete").click()
    await expect(page.get_by_role("alert")).to_contain_text("used by model routes smart")
    route_id = (await page.goto("/providers")) and await page.locator(
        'section[data-route="smart"]'
    ).get_attribute("id")
    assert route_id is not None

    # A viewer, without JavaScript: everything shown, no form, and the server refuses a move.
    await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
    ctx = await browser.new_context(base_url=server.base_url, java_script_enabled=False)
    try:
        ctx.set_default_timeout(TIMEOUT_MS)
        await ctx.add_init_script(CSP_PROBE)
        tab = await ctx.new_page()
        await sign_in(tab, server, "viewer@example.com", PASSWORD)
        await tab.goto("/providers")
        await expect(tab.locator('#providers tr[data-provider="flaky"] .status')).to_have_text(
            "open"
        )
        await expect(chain_of(tab, "smart")).to_have_text(["flaky/sim-1@503", "good/sim-1"])
        assert await tab.locator("main form").count() == 0
        await expect(tab.get_by_role("button", name=re.compile("Check|Move|Add"))).to_have_count(0)
        csrf = await tab.locator('form.logout input[name="csrf"]').input_value()
        refused = await tab.request.post(
            f"/ui/model-routes/{route_id.removeprefix('route-')}/move",
            form={"csrf": csrf, "index": "1", "link": "good/sim-1", "direction": "up"},
            headers={"Sec-Fetch-Site": "same-origin"},
        )
        assert refused.status == 403
    finally:
        await ctx.close()
