"""The Routines page in a real Chromium on both backends: the create form previews the next
five fire times as the schedule is typed (htmx) and with its button (without JavaScript), shows
the API's error for a bad cron expression or time zone, creates the routine; its page fires it
now, lists the fire with its task (which runs to done), pauses, resumes and deletes it; a
viewer sees no form."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import aiohttp
import pytest
from playwright.async_api import Browser, BrowserContext, Page, expect

from bullpen.domain.access import Role
from tests.support.browser import CSP_PROBE, TIMEOUT_MS, PageErrors
from tests.support.dashboard_checks import clean, sign_in, without_javascript
from tests.support.login import add_user
from tests.support.team import until_ended

pytestmark = [pytest.mark.browser]

PASSWORD = "a long enough viewer password"  # pragma: allowlist secret
CRON = "30 6 1 * *"  # 06:30 on the first of each month
ZONE = "Europe/Berlin"


def first_of_months(count: int) -> list[datetime]:
    """The next `count` 06:30s of a month's first day in Berlin, worked out by hand."""
    zone = ZoneInfo(ZONE)
    now = datetime.now(UTC).astimezone(zone)
    year, month, out = now.year, now.month, []
    while len(out) < count:
        slot = datetime(year, month, 1, 6, 30, tzinfo=zone)
        if slot > now:
            out.append(slot)
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


async def preview_shows(page: Page, expected: list[datetime]) -> None:
    times = page.locator("#preview li time")
    await expect(times).to_have_count(5)
    assert [await t.get_attribute("datetime") for t in await times.all()] == [
        s.astimezone(UTC).isoformat() for s in expected
    ]
    await expect(times.first).to_have_text(expected[0].strftime("%a %Y-%m-%d %H:%M %Z"))


async def no_js(browser: Browser, server: Any) -> BrowserContext:
    ctx = await browser.new_context(base_url=server.base_url, java_script_enabled=False)
    ctx.set_default_timeout(TIMEOUT_MS)
    await ctx.add_init_script(CSP_PROBE)
    return ctx


async def test_routines_page_previews_creates_fires_pauses_and_deletes(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    await sign_in(page, server)
    await page.get_by_role("link", name="Routines").click()
    await expect(page).to_have_url(f"{server.base_url}/routines")
    form = page.get_by_role("form", name="New routine")
    await form.get_by_label("Name", exact=True).fill("monthly-report")
    await form.get_by_label("Agent").select_option(str(server.boot.agent_id))

    # As the schedule is typed, the preview follows (htmx, debounced).
    await form.get_by_label("Cron expression").fill(CRON)
    await form.get_by_label("Time zone").fill(ZONE)
    await preview_shows(page, first_of_months(5))
    # A bad expression or zone: the API's own error, in place of the times.
    await form.get_by_label("Cron expression").fill("61 * * * *")
    await expect(page.locator("#preview .error")).to_contain_text("cron: ")
    await expect(page.locator("#preview li")).to_have_count(0)
    await form.get_by_label("Cron expression").fill("0 9 * *")
    await expect(page.locator("#preview .error")).to_contain_text(
        "cron: String should match pattern"
    )
    await form.get_by_label("Cron expression").fill(CRON)
    await form.get_by_label("Time zone").fill("Mars/Olympus_Mons")
    await expect(page.locator("#preview .error")).to_contain_text(
        "timezone: unknown time zone 'Mars/Olympus_Mons'"
    )
    await form.get_by_label("Time zone").fill(ZONE)
    await preview_shows(page, first_of_months(5))
    await clean(page, page_errors)

    await form.get_by_label("Prompt").fill("Write the monthly report for the board.")
    await form.get_by_role("button", name="Create routine").click()
    await expect(page).to_have_url(re.compile(r"/routines/[0-9a-f-]{36}$"))
    expected = first_of_months(5)
    await expect(page.locator("#next-fire")).to_have_text(
        expected[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    )
    await expect(page.locator("#upcoming li")).to_have_count(5)
    await expect(page.locator("#no-fires")).to_be_visible()

    # Fire now: the history lists it with its task, which runs to done.
    await page.get_by_role("button", name="Fire now").click()
    fires = page.locator("#fires tbody tr")
    await expect(fires).to_have_count(1)
    await expect(fires.first).to_contain_text("fired now")
    await expect(fires.first.locator(".status")).to_have_text("created")
    href = await fires.first.get_by_role("link", name="open the task").get_attribute("href")
    assert href is not None
    async with aiohttp.ClientSession() as http:
        task = await until_ended(http, server, href.rsplit("/", 1)[1])
    assert task["status"] == "done"
    assert task["prompt"] == "Write the monthly report for the board."
    await clean(page, page_errors)

    # Pause and resume.
    await page.get_by_role("button", name="Pause").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("paused")
    await expect(page.locator("#next-fire")).to_have_text("none (paused)")
    await page.get_by_role("button", name="Resume").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("active")
    routine_url = page.url

    # The list shows it; a viewer sees it without any form.
    await page.goto("/routines")
    row = page.locator('#routines tr[data-routine="monthly-report"]')
    await expect(row.locator(".status")).to_have_text("active")
    await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
    viewer = await no_js(browser, server)
    try:
        tab = await viewer.new_page()
        await sign_in(tab, server, "viewer@example.com", PASSWORD)
        await tab.goto("/routines")
        await expect(tab.locator('#routines tr[data-routine="monthly-report"]')).to_be_visible()
        assert await tab.locator("main form").count() == 0
        await tab.goto(routine_url)
        await expect(tab.locator("#fires tbody tr")).to_have_count(1)
        assert await tab.locator("main form").count() == 0
        csrf = await tab.locator('form.logout input[name="csrf"]').input_value()
        refused = await tab.request.post(
            routine_url.replace("/routines/", "/ui/routines/") + "/fire",
            form={"csrf": csrf},
            headers={"Sec-Fetch-Site": "same-origin"},
        )
        assert refused.status == 403
    finally:
        await viewer.close()

    # Without JavaScript, the Preview button re-renders the form with the times (or the error).
    admin = await no_js(browser, server)
    try:
        tab = await admin.new_page()
        await sign_in(tab, server)
        await tab.goto("/routines")
        plain = tab.get_by_role("form", name="New routine")
        await plain.get_by_label("Name", exact=True).fill("second")
        await plain.get_by_label("Cron expression").fill("61 * * * *")
        await plain.get_by_role("button", name="Preview fire times").click()
        await expect(tab.locator("#preview .error")).to_contain_text("cron: ")
        plain = tab.get_by_role("form", name="New routine")
        await expect(plain.get_by_label("Name", exact=True)).to_have_value("second")
        await plain.get_by_label("Cron expression").fill(CRON)
        await plain.get_by_label("Time zone").fill(ZONE)
        await plain.get_by_role("button", name="Preview fire times").click()
        await preview_shows(tab, first_of_months(5))
    finally:
        await admin.close()

    # Delete, after a confirmation.
    await page.goto(routine_url)
    await page.get_by_role("button", name="Delete").click()
    await expect(page.get_by_role("alertdialog")).to_contain_text("Delete monthly-report?")
    await page.get_by_role("button", name="Yes, delete").click()
    await expect(page).to_have_url(f"{server.base_url}/routines")
    await expect(page.locator('#routines tr[data-routine="monthly-report"]')).to_have_count(0)
    await clean(page, page_errors)


def next_monday_nine() -> datetime:
    """The next Monday 09:00 UTC: the schedule the edited routine starts with."""
    now = datetime.now(UTC)
    day = now.replace(hour=9, minute=0, second=0, microsecond=0)
    while day.weekday() != 0 or day <= now:
        day += timedelta(days=1)
    return day


async def test_routine_page_edits_with_the_preview_and_refuses_a_viewer(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{server.base_url}/api/v1/routines",
            json={
                "name": "weekly-digest",
                "agent_id": str(server.boot.agent_id),
                "cron": "0 9 * * 1",
                "timezone": "UTC",
                "prompt": "Write the weekly digest of the open tasks.",
                "title": "Weekly digest",
                "labels": ["ops"],
            },
            headers=server.auth,
        ) as resp:
            assert resp.status == 201, await resp.text()
            routine = await resp.json()
    url = f"/routines/{routine['id']}"
    monday = next_monday_nine().strftime("%Y-%m-%d %H:%M UTC")

    await sign_in(page, server)
    await page.goto(url)
    form = page.get_by_role("form", name="Edit routine")
    await expect(form.get_by_label("Name", exact=True)).to_have_value("weekly-digest")
    await expect(form.get_by_label("Cron expression")).to_have_value("0 9 * * 1")
    await expect(form.get_by_label("Labels")).to_have_value("ops")
    await expect(form.get_by_label("Active (fires on schedule)")).to_be_checked()
    await clean(page, page_errors)

    # The new schedule's next five fire times show as it is typed, before anything is saved.
    await form.get_by_label("Cron expression").fill("61 * * * *")
    await expect(page.locator("#preview .error")).to_contain_text("cron: ")
    await form.get_by_label("Cron expression").fill(CRON)
    await form.get_by_label("Time zone").fill(ZONE)
    await preview_shows(page, first_of_months(5))
    await expect(page.locator("#next-fire")).to_have_text(monday)  # not saved yet

    # A value the API refuses: the API's own message, the form as typed.
    await form.get_by_label("Prompt").fill("short")
    await form.get_by_role("button", name="Save changes").click()
    async with aiohttp.ClientSession() as http:
        async with http.patch(
            f"{server.base_url}/api/v1/routines/{routine['id']}",
            json={"prompt": "short"},
            headers=server.auth,
        ) as resp:
            assert resp.status == 422
            [api_error] = (await resp.json())["errors"]
    await expect(page.get_by_role("alert")).to_have_text(
        f"{api_error['field']}: {api_error['message']}"
    )
    form = page.get_by_role("form", name="Edit routine")
    await expect(form.get_by_label("Cron expression")).to_have_value(CRON)
    await expect(page.locator("#next-fire")).to_have_text(monday)
    await preview_shows(page, first_of_months(5))

    # Saved: the page shows the new schedule and its fire times; one audit event, with only
    # what changed.
    await form.get_by_label("Prompt").fill("Write the monthly digest of the open tasks.")
    await form.get_by_label("Name", exact=True).fill("monthly-digest")
    await form.get_by_role("button", name="Save changes").click()
    await expect(page).to_have_url(f"{server.base_url}{url}")
    await expect(page.get_by_role("heading", level=1)).to_contain_text("monthly-digest")
    expected = first_of_months(5)
    await expect(page.locator("#next-fire")).to_have_text(
        expected[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
    )
    upcoming = page.locator("#upcoming li time")
    await expect(upcoming).to_have_count(5)
    assert [await t.get_attribute("datetime") for t in await upcoming.all()] == [
        s.astimezone(UTC).isoformat() for s in expected
    ]
    await expect(page.locator("dl.facts")).to_contain_text(f"{CRON} in {ZONE}")
    await expect(form.get_by_label("Time zone")).to_have_value(ZONE)
    await clean(page, page_errors, 422)
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{server.base_url}/api/v1/audit-events",
            params={"action": "routine.update", "target_id": routine["id"]},
            headers=server.auth,
        ) as resp:
            assert resp.status == 200
            [event] = (await resp.json())["items"]
    assert event["data"]["after"] == {
        "name": "monthly-digest",
        "cron": CRON,
        "timezone": ZONE,
        "prompt": "Write the monthly digest of the open tasks.",
        "next_fire_at": expected[0].astimezone(UTC).isoformat(),
    }
    assert event["data"]["before"]["cron"] == "0 9 * * 1"
    # The Audit page lists it too.
    await page.goto(f"/audit?action=routine.update&target={routine['id']}")
    rows = page.locator("#audit tbody tr[data-event-id]")
    await expect(rows).to_have_count(1)
    assert await rows.first.get_attribute("data-event-id") == event["id"]

    # Without JavaScript, the Preview button shows the typed schedule's times, saving nothing.
    plain = await without_javascript(browser, server)
    try:
        tab = await plain.new_page()
        await sign_in(tab, server)
        await tab.goto(url)
        edit = tab.get_by_role("form", name="Edit routine")
        await edit.get_by_label("Cron expression").fill("0 9 * * 1")
        await edit.get_by_label("Time zone").fill("UTC")
        await edit.get_by_role("button", name="Preview fire times").click()
        times = tab.locator("#preview li time")
        await expect(times).to_have_count(5)
        assert await times.first.get_attribute("datetime") == next_monday_nine().isoformat()
        edit = tab.get_by_role("form", name="Edit routine")
        await expect(edit.get_by_label("Cron expression")).to_have_value("0 9 * * 1")
        await expect(tab.locator("#next-fire")).to_have_text(
            expected[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        )
    finally:
        await plain.close()

    # A viewer sees no edit form, and a forged edit (or preview) is refused, audited, and
    # changes nothing.
    viewer_id = await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
    viewer = await no_js(browser, server)
    try:
        tab = await viewer.new_page()
        await sign_in(tab, server, "viewer@example.com", PASSWORD)
        await tab.goto(url)
        await expect(tab.locator("#next-fire")).to_be_visible()
        await expect(tab.get_by_role("form", name="Edit routine")).to_have_count(0)
        assert await tab.locator("main form").count() == 0
        csrf = await tab.locator('form.logout input[name="csrf"]').input_value()
        for action in ("save", "preview"):
            forged = await tab.request.post(
                f"/ui/routines/{routine['id']}",
                form={"csrf": csrf, "action": action, "cron": "* * * * *", "timezone": "UTC"},
                headers={"Sec-Fetch-Site": "same-origin"},
            )
            assert forged.status == 403, action
            assert "this needs the `agents:write` permission" in await forged.text()
    finally:
        await viewer.close()
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{server.base_url}/api/v1/routines/{routine['id']}", headers=server.auth
        ) as resp:
            assert (await resp.json())["cron"] == CRON
        async with http.get(
            f"{server.base_url}/api/v1/audit-events",
            params={"action": "access.denied", "actor_id": str(viewer_id)},
            headers=server.auth,
        ) as resp:
            assert len((await resp.json())["items"]) == 2
