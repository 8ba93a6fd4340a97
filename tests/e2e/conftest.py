"""Browser fixtures: Debian's Chromium driven by Playwright's async API.

One Chromium per process (pytest-xdist worker), started by the first browser test and shared
by the rest: starting Playwright's driver and Chromium took 2-5 s a test on two busy cores.
Every test still gets fresh cookie jars (browser contexts, which share no cookies, storage or
cache) and its own server and database; a context a test leaves open is closed after it. The
browser tests therefore run in the session's event loop (`loop_scope="session"`, set below),
and the fixtures they share with other tests that hold loop-bound objects (`server`, `store`,
`http`) are redefined here in that loop.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from bullpen.app import open_store
from bullpen.settings import Settings
from bullpen.store.base import Store
from tests.support.browser import (
    BROWSER_LOOP,
    CHROMIUM,
    CHROMIUM_ARGS,
    CSP_PROBE,
    TIMEOUT_MS,
    ContextFactory,
    PageErrors,
)
from tests.support.servers import RunningServer, serving


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run every browser test in the session's loop, the loop the shared browser lives in."""
    here = Path(__file__).resolve().parent
    for item in items:
        if item.path.resolve().is_relative_to(here) and inspect.iscoroutinefunction(
            getattr(item, "obj", None)
        ):
            # First, so it is the closest `asyncio` marker (asyncio_mode=auto adds a bare one).
            item.add_marker(pytest.mark.asyncio(loop_scope=BROWSER_LOOP), append=False)


@pytest_asyncio.fixture(scope="session", loop_scope=BROWSER_LOOP)
async def browser() -> AsyncIterator[Browser]:
    """A headless Chromium for this process's browser tests."""
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest_asyncio.fixture(autouse=True, loop_scope=BROWSER_LOOP)
async def _contexts_closed(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Closes the contexts a browser test opened itself and left open, so the next test's
    browser holds only its own."""
    if "browser" not in request.fixturenames:
        yield
        return
    shared: Browser = request.getfixturevalue("browser")
    before = set(shared.contexts)
    yield
    for ctx in shared.contexts:
        if ctx not in before:
            await ctx.close()


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def server(settings: Settings) -> AsyncIterator[RunningServer]:
    """A bootstrapped server for this test (tests/conftest.py's), in the browser's loop."""
    async with serving(settings) as running:
        yield running


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def store(settings: Settings) -> AsyncIterator[Store]:
    """A migrated store on the requested backend (tests/conftest.py's), in the browser's loop."""
    async with open_store(settings) as opened:
        yield opened


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client (tests/conftest.py's), in the browser's loop."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
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


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def context(new_context: ContextFactory) -> BrowserContext:
    """The test's main cookie jar."""
    return await new_context()


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def page_errors() -> PageErrors:
    """The errors `page` collected so far."""
    return PageErrors()


@pytest_asyncio.fixture(loop_scope=BROWSER_LOOP)
async def page(context: BrowserContext, page_errors: PageErrors) -> Page:
    """A tab in `context` whose console errors and uncaught exceptions are recorded."""
    tab = await context.new_page()
    tab.on("console", page_errors.on_console)
    tab.on("pageerror", page_errors.on_pageerror)
    return tab
