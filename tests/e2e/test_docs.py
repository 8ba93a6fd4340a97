"""/docs in a real Chromium: Swagger UI renders from this origin under Bullpen's own CSP."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import Page, expect

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("backend", ["sqlite"], indirect=True),
]


async def test_the_api_reference_renders_with_no_csp_violation(
    server: Any, page: Page, page_errors: Any
) -> None:
    outside: list[str] = []
    page.on(
        "request",
        lambda request: (
            None if request.url.startswith(server.base_url) else outside.append(request.url)
        ),
    )
    await page.goto("/docs")
    # An operation of the document, rendered by Swagger UI from /openapi.json.
    await expect(
        page.locator(".opblock-summary-path", has_text="/api/v1/tasks").first
    ).to_be_visible()
    assert await page.evaluate("window.__cspViolations") == []
    assert page_errors.console == []
    assert page_errors.uncaught == []
    assert [u for u in outside if not u.startswith("data:")] == []
