"""The dashboard's browser tests' common steps: signing in through the form, and checking that
a page obeyed its CSP, ran without errors and has no serious accessibility violation."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Browser, BrowserContext, Page, expect

from tests.support.axe import grave_violations
from tests.support.browser import CSP_PROBE, TIMEOUT_MS, PageErrors


async def sign_in(page: Page, server: Any, email: str = "", password: str = "") -> None:
    """Sign in (the bootstrap admin by default) and land on the task list."""
    await page.goto("/login")
    await page.get_by_label("Email").fill(email or server.boot.email)
    await page.get_by_label("Password").fill(password or server.boot.password)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(f"{server.base_url}/")


async def clean(page: Page, errors: PageErrors, *refusals: int) -> None:
    """The page obeyed its CSP, ran without errors, and axe finds nothing serious. Chromium
    logs a deliberately refused request as a failed resource load: `refusals` are the
    statuses the test provoked."""
    assert await page.evaluate("window.__cspViolations") == []
    expected = tuple(f"status of {status}" for status in refusals)
    assert [m for m in errors.console if not any(e in m for e in expected)] == []
    assert errors.uncaught == []
    assert await grave_violations(page) == []


async def without_javascript(browser: Browser, server: Any) -> BrowserContext:
    """A cookie jar whose pages run no script (the caller closes it)."""
    ctx = await browser.new_context(base_url=server.base_url, java_script_enabled=False)
    ctx.set_default_timeout(TIMEOUT_MS)
    await ctx.add_init_script(CSP_PROBE)
    return ctx
