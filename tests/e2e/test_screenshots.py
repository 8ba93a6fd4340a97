"""Screenshots of the dashboard for the docs (`make screenshots`): every page of the ui bench's
registry (`bullpen.bench.uipages.PAGES`, those marked `shot`) on a seeded demo workspace, in
light mode at 1280×800, and the task list also at phone width, written to docs/screenshots/.

Opt-in (BULLPEN_SCREENSHOTS=1): it rewrites files in the repository.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from bullpen.bench.uipages import PAGES
from bullpen.store.demo import DemoSize, seed_demo
from tests.support.browser import CSP_PROBE, TIMEOUT_MS, PageErrors

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        os.environ.get("BULLPEN_SCREENSHOTS") != "1",
        reason="opt-in: `make screenshots` (BULLPEN_SCREENSHOTS=1) rewrites docs/screenshots/",
    ),
]

OUT = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
MAX_BYTES = 200_000  # each PNG, so the repository and the README stay light


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.with_settings(worker_enabled=False)  # the seeded history stays as it was made
async def test_screenshots_of_every_page(server: Any, browser: Browser) -> None:
    seeded = await seed_demo(
        server.services.store,
        server.boot.workspace_id,
        size=DemoSize(tasks=400, events=4_000, agents=24, days=2),
    )
    values = seeded.as_dict()
    OUT.mkdir(parents=True, exist_ok=True)
    written = []
    for width, viewport in (("", DESKTOP), ("-phone", PHONE)):
        context = await browser.new_context(
            base_url=server.base_url, viewport=viewport, color_scheme="light"
        )
        context.set_default_timeout(TIMEOUT_MS)
        await context.add_init_script(CSP_PROBE)
        tab = await context.new_page()
        errors = PageErrors()
        tab.on("console", errors.on_console)
        tab.on("pageerror", errors.on_pageerror)
        await tab.goto("/login")
        await tab.get_by_label("Email").fill(server.boot.email)
        await tab.get_by_label("Password").fill(server.boot.password)
        await tab.get_by_role("button", name="Sign in").click()
        await expect(tab).to_have_url(f"{server.base_url}/")
        for page in PAGES:
            if not page.shot or (width and not page.phone):
                continue
            answer = await tab.goto(page.url_path(values), wait_until="load")
            assert answer is not None and answer.status == 200, page
            await tab.wait_for_timeout(300)  # htmx's first swaps and the live list settle
            path = OUT / f"{page.name}{width}.png"
            await tab.screenshot(path=str(path))
            written.append(path)
        assert errors.console == [] and errors.uncaught == []
        assert await tab.evaluate("window.__cspViolations") == []
        await context.close()
    for path in written:
        assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes"
