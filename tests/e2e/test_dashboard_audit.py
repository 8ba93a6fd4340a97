"""The audit log page in a real Chromium on both backends: API calls and 55 older events
written through the store seed it; its pages are the API's keyset pages, newest first; the
actor, action, target and time filters narrow it to what the API's filters return; a bad
filter is a 422 in place; a viewer (no `audit:read`) gets the API's 403 as the page's error,
audited; without JavaScript the filters are a plain GET."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from playwright.async_api import Browser, Page, expect

from bullpen.domain.access import Role
from bullpen.store import audit
from bullpen.store.tables import users
from tests.support.browser import PageErrors
from tests.support.dashboard_checks import clean, sign_in, without_javascript
from tests.support.db import rows
from tests.support.login import add_user
from tests.support.spend import make_budget
from tests.support.team import create_task, make_agent, until_ended

pytestmark = [pytest.mark.browser]

PASSWORD = "a long enough viewer password"  # pragma: allowlist secret
OLDER = 55  # events written two days back, more than a page of 50


async def events(http: aiohttp.ClientSession, server: Any, **query: str) -> dict[str, Any]:
    async with http.get(
        f"{server.base_url}/api/v1/audit-events", params=query, headers=server.auth
    ) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def listed(page: Page) -> list[str]:
    """The event ids the page lists, in order."""
    ids: list[str] = await page.locator("#audit tbody tr[data-event-id]").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.eventId)"
    )
    return ids


async def filter_by(page: Page, **fields: str) -> None:
    """Fill the filter form (other fields emptied) and submit it."""
    form = page.locator("form.filters")
    for name in ("action", "target", "since", "until"):
        await form.locator(f'[name="{name}"]').fill(fields.get(name, ""))
    await form.locator('[name="actor"]').select_option(fields.get("actor", ""))
    await form.get_by_role("button", name="Filter").click()


async def test_audit_log_filters_pages_and_refuses_a_viewer(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    async with aiohttp.ClientSession() as http:
        agent = await make_agent(http, server, "alpha")
        budget = await make_budget(http, server, scope="workspace", amount_usd=3.0)
        async with http.patch(
            f"{server.base_url}/api/v1/budgets/{budget['id']}",
            json={"amount_usd": 4.0},
            headers=server.auth,
        ) as resp:
            assert resp.status == 200, await resp.text()
        task = await create_task(http, server, agent, "Count the open invoices, please.")
        await until_ended(http, server, task["id"])
        admin_of = sa.select(users.c.id).where(users.c.email == server.boot.email)
        [admin] = await rows(server, admin_of)
        about = uuid.uuid4()
        older = (datetime.now(UTC) - timedelta(days=2)).replace(second=0, microsecond=0)
        async with server.services.store.write() as conn:
            for i in range(OLDER):
                await audit.record(
                    conn,
                    workspace_id=server.boot.workspace_id,
                    actor_type="user",
                    actor_id=admin.id,
                    action="member.update",
                    target_type="user",
                    target_id=about,
                    now=older + timedelta(minutes=i),
                    data={"n": i},
                )

        await sign_in(page, server)
        await page.get_by_role("link", name="Audit log").click()
        await expect(page).to_have_url(f"{server.base_url}/audit")
        first = await events(http, server, limit="50")
        await expect(page.locator("#audit tbody tr")).to_have_count(50)
        assert await listed(page) == [e["id"] for e in first["items"]]
        times = await page.locator("#audit tbody time").evaluate_all(
            "(ts) => ts.map((t) => t.getAttribute('datetime'))"
        )
        assert times == sorted(times, reverse=True)  # newest first
        await clean(page, page_errors, 403, 422)

        # The next page (in place) is the API's next page, and the last.
        await page.get_by_role("link", name="Next page").click()
        await expect(page).to_have_url(re.compile(r"cursor="))
        second = await events(http, server, limit="50", cursor=first["next_cursor"])
        assert second["next_cursor"] is None
        await expect(page.locator("#audit tbody tr")).to_have_count(len(second["items"]))
        assert await listed(page) == [e["id"] for e in second["items"]]
        await expect(page.get_by_role("link", name="Next page")).to_have_count(0)

        # Action: only the budget's change.
        await filter_by(page, action="budget.update")
        await expect(page).to_have_url(re.compile(r"action=budget\.update"))
        await expect(page.locator("#audit tbody tr")).to_have_count(1)
        [changed] = (await events(http, server, action="budget.update"))["items"]
        assert await listed(page) == [changed["id"]]

        # Actor: the admin user, picked by email: the seeded events only (the API's were the
        # bootstrap key's); a page of 50 and a next one.
        await filter_by(page, actor=str(admin.id))
        await expect(page).to_have_url(re.compile(f"actor={admin.id}"))
        await expect(page.locator("#audit tbody tr")).to_have_count(50)
        by_admin = await events(http, server, actor_id=str(admin.id), limit="100")
        assert len(by_admin["items"]) == OLDER
        assert await listed(page) == [e["id"] for e in by_admin["items"][:50]]
        actors = await page.locator("#audit tbody tr td:nth-child(2)").all_inner_texts()
        assert set(actors) == {server.boot.email}

        # Target: a task's events, by following its target link.
        await filter_by(page, action="task.create")
        await page.get_by_role("link", name=task["id"][:8]).first.click()
        await expect(page).to_have_url(re.compile(f"target={task['id']}"))
        about_task = await events(http, server, target_id=task["id"], action="task.create")
        await expect(page.locator("#audit tbody tr")).to_have_count(len(about_task["items"]))
        assert await listed(page) == [e["id"] for e in about_task["items"]]

        # Time range: ten of the older events (the 21st to the 30th), `Before` excluded.
        since = (older + timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%S")
        until = (older + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%S")
        await filter_by(page, since=since, until=until)
        await expect(page.locator("#audit tbody tr")).to_have_count(10)
        middle = by_admin["items"][OLDER - 30 : OLDER - 20]  # newest first
        assert [e["data"]["n"] for e in middle] == list(range(29, 19, -1))
        assert await listed(page) == [e["id"] for e in middle]
        # The API's `since` and `until`, read by the same code, select the same events.
        by_time = await events(http, server, since=since, until=until)
        assert [e["id"] for e in by_time["items"]] == [e["id"] for e in middle]
        await clean(page, page_errors, 403, 422)

        # A malformed filter: the API's 422 message, in place of the list (a range the wrong way
        # round is the API's own `until` problem).
        await filter_by(page, target="not-an-id")
        await expect(page.get_by_role("alert")).to_have_text("target: not an id")
        await expect(page.locator("#audit tbody tr[data-event-id]")).to_have_count(0)
        await filter_by(page, since=until, until=since)
        await expect(page.get_by_role("alert")).to_have_text("until: must not be before since")
        await clean(page, page_errors, 403, 422)

        # A viewer: no link to the log, and the page is the API's 403, audited.
        viewer = await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
        ctx = await browser.new_context(base_url=server.base_url)
        try:
            tab = await ctx.new_page()
            await sign_in(tab, server, "viewer@example.com", PASSWORD)
            await expect(tab.get_by_role("link", name="Audit log")).to_have_count(0)
            answer = await tab.goto("/audit")
            assert answer is not None and answer.status == 403
            await expect(tab.get_by_role("alert")).to_have_text(
                "this needs the `audit:read` permission"
            )
            assert await tab.locator("#audit").count() == 0
        finally:
            await ctx.close()
        denied = await events(http, server, action="access.denied", actor_id=str(viewer))
        assert len(denied["items"]) == 1

    # Without JavaScript: the filter form is a plain GET.
    ctx = await without_javascript(browser, server)
    try:
        tab = await ctx.new_page()
        await sign_in(tab, server)
        await tab.goto("/audit")
        await tab.locator('form.filters [name="action"]').fill("budget.create")
        await tab.locator("form.filters").get_by_role("button", name="Filter").click()
        await expect(tab).to_have_url(re.compile(r"action=budget\.create"))
        await expect(tab.locator("#audit tbody tr")).to_have_count(1)
        await expect(tab.locator("#audit tbody tr td").nth(2)).to_have_text("budget.create")
    finally:
        await ctx.close()
