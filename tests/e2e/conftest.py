"""Browser fixtures: Debian's Chromium driven by Playwright's async API in the test's loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from tests.support.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    CSP_PROBE,
    TIMEOUT_MS,
    ContextFactory,
    PageErrors,
)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """A headless Chromium for this test (the loop is per test, so the browser is too)."""
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def new_context(browser: Browser, server: Any) -> AsyncIterator[ContextFactory]:
    """Opens fresh cookie jars pointed at the test's server; all closed at teardown."""
    opened: list[BrowserContext] = []

    async def open_one() -> BrowserContext:
        ctx = await browser.new_context(base_url=server.base_url)
        opened.append(ctx)
        ctx.set_default_timeout(TIMEOUT_MS)
        await ctx.add_init_script(CSP_PROBE)
        return ctx

    try:
        yield open_one
    finally:
        for ctx in opened:
            await ctx.close()


@pytest.fixture
async def context(new_context: ContextFactory) -> BrowserContext:
    """The test's main cookie jar."""
    return await new_context()


@pytest.fixture
async def page_errors() -> PageErrors:
    """The errors `page` collected so far."""
    return PageErrors()


@pytest.fixture
async def page(context: BrowserContext, page_errors: PageErrors) -> Page:
    """A tab in `context` whose console errors and uncaught exceptions are recorded."""
    tab = await context.new_page()
    tab.on("console", page_errors.on_console)
    tab.on("pageerror", page_errors.on_pageerror)
    return tab
