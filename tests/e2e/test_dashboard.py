"""The dashboard in a real Chromium on both backends: one test per page's main flow, each page
checked for CSP violations, script errors and (axe-core) serious or critical accessibility
violations; the task list and a form also without JavaScript; a viewer sees no forms."""

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
from tests.support.team import (
    create_task,
    delegate,
    finish,
    get_task,
    make_agent,
    until_ended,
)

pytestmark = [pytest.mark.browser]

PASSWORD = "a long enough viewer password"  # pragma: allowlist secret


async def _agent(http: aiohttp.ClientSession, server: Any, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{server.base_url}/api/v1/agents", json=body, headers=server.auth) as r:
        assert r.status == 201, await r.text()
        return dict(await r.json())


async def gated_agent(http: aiohttp.ClientSession, server: Any, name: str) -> dict[str, Any]:
    """An agent whose every new task waits for an approval (so it stays open)."""
    return await _agent(
        http,
        server,
        {
            "name": name,
            "requires_approval": True,
            "config": {"provider": "simulated", "model": "sim-1"},
        },
    )


async def test_tasks_page_filters_searches_creates_and_bulk_cancels(
    server: Any, page: Page, page_errors: PageErrors, browser: Browser
) -> None:
    """Create a task with labels, priority and a blocker from the form; filter and search the
    list (htmx, URL kept); cancel two open tasks at once; the list works without JavaScript;
    a viewer sees neither the create form nor bulk cancel."""
    async with aiohttp.ClientSession() as http:
        gate = await gated_agent(http, server, "gatekeeper")
        first = await create_task(http, server, gate, "First task that waits for approval.")
        second = await create_task(http, server, gate, "Second task that waits for approval.")
        await sign_in(page, server)
        await page.wait_for_selector('#tasks[data-live="true"]', state="attached")

        await page.get_by_label("Agent").select_option(str(server.boot.agent_id))
        await page.get_by_label("Title").fill("Quarterly numbers")
        await page.get_by_label("Prompt").fill("Compute the quarterly numbers for the board.")
        await page.get_by_label("Priority").fill("5")
        await page.get_by_label("Labels").fill("finance, q3")
        await page.get_by_label("Blocked by").select_option(first["id"])
        await page.get_by_role("button", name="Create task").click()
        await expect(page).to_have_url(re.compile(r"/tasks/[0-9a-f-]{36}$"))
        created = page.url.rsplit("/", 1)[1]
        await expect(page.locator("#status")).to_have_text("blocked")
        task = await get_task(http, server, created)
        assert task["priority"] == 5 and task["labels"] == ["finance", "q3"]

        # Filters: a label, then a search on the prompt's text; htmx keeps the URL in step.
        await page.goto("/")
        await page.locator('form.filters [name="label"]').fill("finance")
        await page.get_by_role("button", name="Filter").click()
        await expect(page).to_have_url(re.compile(r"label=finance"))
        rows = page.locator("#tasks tbody tr")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-task-id", created)
        await page.locator('form.filters [name="label"]').fill("")
        await page.get_by_label("Search").fill("SECOND task")
        await page.get_by_role("button", name="Filter").click()
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-task-id", second["id"])
        await page.goto("/?status=awaiting_approval")  # a filtered list's own URL
        await expect(page.get_by_label("Status")).to_have_value("awaiting_approval")
        await expect(rows).to_have_count(2)
        await clean(page, page_errors, 422)

        # Bulk cancel: both selected, both cancelled, the list says so.
        for one in (first, second):
            await page.locator(f'tr[data-task-id="{one["id"]}"] input[type=checkbox]').check()
        await page.get_by_role("button", name="Cancel selected").click()
        await expect(page.get_by_role("status")).to_have_text("Cancelled 2 tasks.")
        for one in (first, second):
            got = await until_ended(http, server, one["id"], timeout_s=10)
            assert got["status"] == "cancelled"
        # The blocked task woke when its blocker ended (the list is live).
        await page.goto("/")
        badge = page.locator(f'tr[data-task-id="{created}"] .status')
        await expect(badge).to_have_text("done", timeout=15_000)

    # Without JavaScript: the filter form is a plain GET; a viewer gets no forms.
    await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
    ctx = await browser.new_context(base_url=server.base_url, java_script_enabled=False)
    try:
        ctx.set_default_timeout(TIMEOUT_MS)
        await ctx.add_init_script(CSP_PROBE)
        tab = await ctx.new_page()
        await sign_in(tab, server, "viewer@example.com", PASSWORD)
        await tab.get_by_label("Status").select_option("cancelled")
        await tab.get_by_role("button", name="Filter").click()
        await expect(tab).to_have_url(re.compile(r"status=cancelled"))
        await expect(tab.locator("#tasks tbody tr")).to_have_count(2)
        await expect(tab.get_by_role("button", name="Create task")).to_have_count(0)
        await expect(tab.get_by_role("button", name="Cancel selected")).to_have_count(0)
        # The server refuses a viewer's cancel whatever the page shows.
        csrf = await tab.locator('form.logout input[name="csrf"]').input_value()
        refused = await tab.request.post(
            "/ui/tasks/cancel",
            form={"csrf": csrf, "task_id": created},
            headers={"Sec-Fetch-Site": "same-origin"},
        )
        assert refused.status == 403
    finally:
        await ctx.close()


async def test_task_page_shows_the_live_subtask_tree_timeline_and_comments(
    server: Any, page: Page, page_errors: PageErrors
) -> None:
    """A manager that delegates: the subtask appears in the tree live, the timeline shows the
    attempt, its tool calls (collapsible) and each LLM call; a comment is added."""
    async with aiohttp.ClientSession() as http:
        manager = await make_agent(
            http,
            server,
            "manager",
            [
                {"tool_calls": [delegate("worker", "Collect the numbers for the report.")]},
                {"tool_calls": [finish("Report done.")]},
            ],
        )
        await make_agent(http, server, "worker", reports_to=manager["id"])
        await sign_in(page, server)
        await page.get_by_label("Agent").select_option(manager["id"])
        await page.get_by_label("Prompt").fill("Write the weekly report with the team.")
        await page.get_by_role("button", name="Create task").click()
        await expect(page).to_have_url(re.compile(r"/tasks/[0-9a-f-]{36}$"))
        await page.wait_for_selector('#task[data-ended="true"]', state="attached", timeout=20_000)
    await expect(page.locator("#status")).to_have_text("done")
    child = page.locator("#subtasks li")
    await expect(child).to_have_count(1)
    await expect(child.locator(".status")).to_have_text("done")
    timeline = page.locator("#timeline")
    await expect(timeline.get_by_role("heading", name=re.compile("Attempt 1"))).to_be_visible()
    call = timeline.locator("summary", has_text="Tool call delegate").first
    await expect(call).to_be_visible()
    await call.click()
    await expect(timeline.locator("details[open] pre").first).to_contain_text("worker")
    await expect(timeline.locator("table.calls td", has_text="simulated").first).to_be_visible()

    await page.get_by_role("textbox", name="Comment").fill("Looks right to me.")
    await page.get_by_role("button", name="Add comment").click()
    await expect(page.locator(".comments .body")).to_have_text(["Looks right to me."])
    await clean(page, page_errors, 422)


async def test_agents_page_creates_with_api_errors_charts_and_pauses(
    server: Any, page: Page, page_errors: PageErrors
) -> None:
    """The llm form refuses what the API refuses with the API's message; a new agent shows
    under its manager in the org chart; pausing asks first; today's runs are counted."""
    async with aiohttp.ClientSession() as http:
        done = await create_task(
            http, server, {"id": str(server.boot.agent_id)}, "A run so today has figures."
        )
        await until_ended(http, server, done["id"])
    await sign_in(page, server)
    await page.get_by_role("link", name="Agents").click()
    await expect(page).to_have_url(f"{server.base_url}/agents")
    demo = page.locator(f'tr[data-agent-id="{server.boot.agent_id}"]')
    await expect(demo.locator(".runs-today")).to_have_text("1")

    await page.locator("summary", has_text="New llm agent").click()
    form = page.get_by_role("form", name="New llm agent")
    await form.get_by_label("Name", exact=True).fill("bad name!")
    await form.get_by_label("Model").fill("sim-1")
    await form.get_by_label("Reports to").select_option(str(server.boot.agent_id))
    await form.get_by_role("button", name="Create llm agent").click()
    await expect(page.get_by_role("alert")).to_contain_text("name: String should match pattern")

    form = page.get_by_role("form", name="New llm agent")
    await form.get_by_label("Name", exact=True).fill("analyst")
    await form.get_by_role("button", name="Create llm agent").click()
    await expect(page).to_have_url(f"{server.base_url}/agents")
    chart = page.locator("#org-chart")
    await expect(chart.locator("li li a", has_text="analyst")).to_be_visible()
    await clean(page, page_errors, 422)

    await chart.get_by_role("link", name="analyst").click()
    await page.get_by_role("button", name="Pause").click()
    await expect(page.get_by_role("alertdialog")).to_contain_text("Pause analyst?")
    await page.get_by_role("button", name="Yes, pause").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text("paused")
    await expect(page.get_by_role("button", name="Resume")).to_be_visible()
    edit = page.get_by_role("form", name="Edit analyst")
    await edit.get_by_label("Title").fill("Senior analyst")
    await edit.get_by_role("button", name="Save").click()
    await expect(page.locator("p.meta").first).to_contain_text("Senior analyst")
    await clean(page, page_errors, 422)


async def test_approvals_inbox_is_live_and_approves_with_a_reason(
    server: Any, page: Page, page_errors: PageErrors
) -> None:
    """A gated task's approval appears without a reload; approving it with a reason queues
    the task, which runs to done; the decision and its reason are listed."""
    async with aiohttp.ClientSession() as http:
        gate = await gated_agent(http, server, "gatekeeper")
        await sign_in(page, server)
        await page.get_by_role("link", name="Approvals").click()
        await page.wait_for_selector('body[data-live="true"]', state="attached")
        await expect(page.locator("#no-pending")).to_be_visible()
        task = await create_task(http, server, gate, "Spend money on the quarterly report.")
        card = page.locator(".approval")
        await expect(card).to_have_count(1)
        await expect(card.get_by_role("heading")).to_contain_text(task["number"])
        await clean(page, page_errors, 422)
        await card.get_by_label("Reason").fill("Within this month's plan.")
        await card.get_by_role("button", name="Approve").click()
        await expect(page.locator(".approval")).to_have_count(0)
        decided = page.locator("table.grid tbody tr").first
        await expect(decided).to_contain_text("approved")
        await expect(decided).to_contain_text("Within this month's plan.")
        assert (await until_ended(http, server, task["id"]))["status"] == "done"
