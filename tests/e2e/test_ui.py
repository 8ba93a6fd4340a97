"""The web UI in a real Chromium: sign in, create a task, watch it stream, sign out."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from playwright.async_api import BrowserContext, Cookie, Page, expect

from bullpen.agents.llm import DEFAULT_SYSTEM_PROMPT
from bullpen.api.deps import SESSION_COOKIE
from bullpen.simulator.provider import completion_tokens

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("backend", ["sqlite"], indirect=True),
]

# Slow enough that the stream lasts ~0.5 s in many `text` events; the long first-token delay
# lets the page open its EventSource before the first token, so the text is seen live.
SLOW_SIM = {"sim_ttft_ms": 300.0, "sim_tokens_per_second": 40.0, "sim_response_tokens": 20}

# Records #output's length on every DOM change, with the time and whether the task had ended.
_OUTPUT_TRACE = """
window.__outputTrace = [];
new MutationObserver(() => {
  const output = document.getElementById("output");
  const task = document.getElementById("task");
  if (!output || !task) { return; }
  window.__outputTrace.push({
    t: performance.now(),
    len: output.textContent.length,
    ended: task.dataset.ended === "true",
  });
}).observe(document, {childList: true, subtree: true, characterData: true, attributes: true});
"""


def expected_completion(prompt: str, n: int) -> str:
    """What the simulated provider answers the demo agent with."""
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    return "".join(completion_tokens(messages, n))


def session_cookie(cookies: list[Cookie]) -> Cookie | None:
    """The session cookie among a context's cookies, if any."""
    return next((c for c in cookies if c.get("name") == SESSION_COOKIE), None)


async def sign_in(page: Page, email: str, password: str) -> None:
    """Fill and submit the sign-in form."""
    await page.goto("/login")
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Sign in").click()


async def sign_in_as_admin(page: Page, server: Any) -> None:
    """Sign in with the bootstrap credentials and land on the dashboard."""
    await sign_in(page, server.boot.email, server.boot.password)
    await expect(page).to_have_url(f"{server.base_url}/")
    await expect(page.get_by_role("heading", name="New task")).to_be_visible()


@pytest.mark.with_settings(**SLOW_SIM)
async def test_task_streams_into_its_page(server: Any, page: Page, page_errors: Any) -> None:
    """A task created through the form streams its deterministic text into the page, live."""
    await page.add_init_script(_OUTPUT_TRACE)
    await sign_in_as_admin(page, server)
    prompt = "Summarise the open support tickets for the weekly review."
    await page.get_by_label("Agent").select_option(str(server.boot.agent_id))
    await page.get_by_label("Prompt").fill(prompt)
    await page.get_by_role("button", name="Create task").click()
    await expect(page).to_have_url(
        re.compile(rf"^{re.escape(server.base_url)}/tasks/[0-9a-f-]{{36}}$")
    )

    await page.wait_for_selector('#task[data-ended="true"]', state="attached")

    expected = expected_completion(prompt, server.settings.sim_response_tokens)
    assert await page.locator("#status").text_content() == "done"
    assert await page.locator("#output").text_content() == expected
    await expect(page.locator("#error")).to_be_hidden()

    # Progressive: several partial lengths were on screen before the end, spread over time
    # the way a live stream is (a replay after the fact would land within a few ms).
    trace: list[dict[str, Any]] = await page.evaluate("window.__outputTrace")
    partial = [r for r in trace if 0 < r["len"] < len(expected) and not r["ended"]]
    assert len({r["len"] for r in partial}) >= 3, trace
    ended_at = min(r["t"] for r in trace if r["ended"])
    stream_ms = (SLOW_SIM["sim_response_tokens"] - 1) / SLOW_SIM["sim_tokens_per_second"] * 1000
    assert ended_at - partial[0]["t"] >= stream_ms / 2, trace

    # The pages obey their Content-Security-Policy and run without errors.
    assert await page.evaluate("window.__cspViolations") == []
    assert page_errors.console == []
    assert page_errors.uncaught == []


async def test_wrong_password_is_refused_without_a_session(
    server: Any, page: Page, context: BrowserContext
) -> None:
    """Signed out, `/` sends you to the sign-in form, which refuses a wrong password."""
    await page.goto("/")
    await expect(page).to_have_url(f"{server.base_url}/login")

    await page.get_by_label("Email").fill(server.boot.email)
    await page.get_by_label("Password").fill(server.boot.password + "x")
    async with page.expect_response(f"{server.base_url}/login") as posted:
        await page.get_by_role("button", name="Sign in").click()
    assert (await posted.value).status == 401
    await expect(page.get_by_role("alert")).to_have_text("Wrong email or password.")
    assert session_cookie(await context.cookies()) is None

    # The right password then works, so the absent cookie above was the refusal's doing.
    await sign_in_as_admin(page, server)
    cookie = session_cookie(await context.cookies())
    assert cookie is not None
    assert cookie.get("httpOnly") is True
    assert cookie.get("sameSite") == "Lax"


async def test_too_short_prompt_shows_an_error_and_creates_nothing(
    server: Any, page: Page, context: BrowserContext
) -> None:
    """A 9-character prompt that slips past the browser is refused by the server."""
    await sign_in_as_admin(page, server)
    textarea = page.get_by_label("Prompt")
    await textarea.evaluate("el => el.removeAttribute('minlength')")
    await textarea.fill("123456789")
    async with page.expect_response(f"{server.base_url}/ui/tasks") as posted:
        await page.get_by_role("button", name="Create task").click()
    assert (await posted.value).status == 422

    await expect(page.get_by_role("alert")).to_contain_text("prompt")
    await expect(page.get_by_role("alert")).to_contain_text("at least 10 characters")
    await expect(page.get_by_label("Prompt")).to_have_value("123456789")
    await expect(page.get_by_role("cell", name="No tasks yet.")).to_be_visible()
    listed = await context.request.get(
        "/api/v1/tasks", headers={"Authorization": f"Bearer {server.boot.api_key}"}
    )
    assert listed.status == 200
    assert (await listed.json())["items"] == []


async def test_sign_out_ends_the_session(
    server: Any, page: Page, context: BrowserContext, new_context: Any
) -> None:
    """After signing out, the old session cookie no longer opens the dashboard."""
    await sign_in_as_admin(page, server)
    cookie = session_cookie(await context.cookies())
    assert cookie is not None
    value = cookie["value"]

    # Control: the captured cookie, put into another context, opens the dashboard.
    other = await new_context()
    await other.add_cookies([{"name": SESSION_COOKIE, "value": value, "url": server.base_url}])
    tab = await other.new_page()
    await tab.goto("/")
    await expect(tab).to_have_url(f"{server.base_url}/")

    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(f"{server.base_url}/login")
    assert session_cookie(await context.cookies()) is None

    await context.add_cookies([{"name": SESSION_COOKIE, "value": value, "url": server.base_url}])
    response = await page.goto("/")
    await expect(page).to_have_url(f"{server.base_url}/login")
    assert response is not None
    first = response.request.redirected_from
    assert first is not None
    assert f"{SESSION_COOKIE}={value}" in (await first.all_headers())["cookie"]


async def test_password_change_signs_out_and_the_new_password_works(
    server: Any, page: Page, context: BrowserContext, page_errors: Any
) -> None:
    """Account page: change the password, land signed out, sign in with the new one."""
    await sign_in_as_admin(page, server)
    await page.get_by_role("link", name="Settings").click()
    await page.get_by_role("link", name="Account").click()
    await expect(page).to_have_url(f"{server.base_url}/account")

    new = "a much longer brand-new secret"
    await page.get_by_label("Current password").fill(server.boot.password)
    await page.get_by_label("New password", exact=True).fill(new)
    await page.get_by_label("Confirm new password").fill(new)
    await page.get_by_role("button", name="Change password").click()

    await expect(page).to_have_url(f"{server.base_url}/login?done=password")
    await expect(page.get_by_role("status")).to_have_text(
        "Password changed. Sign in with your new password."
    )
    assert session_cookie(await context.cookies()) is None

    await sign_in(page, server.boot.email, server.boot.password)
    await expect(page.get_by_role("alert")).to_have_text("Wrong email or password.")
    await sign_in(page, server.boot.email, new)
    await expect(page).to_have_url(f"{server.base_url}/")

    assert await page.evaluate("window.__cspViolations") == []
    # Chromium logs the deliberate 401 of the old password as a failed resource load.
    assert [m for m in page_errors.console if "status of 401" not in m] == []
    assert page_errors.uncaught == []


@pytest.mark.with_settings(**SLOW_SIM)
async def test_the_dashboard_list_follows_tasks_live(
    server: Any, page: Page, page_errors: Any
) -> None:
    """A task listed when the page loaded changes status in place, and a task created
    elsewhere (here through the API) appears at the top and runs to `done`, without a
    reload; its title, markup included, shows as text."""
    async with aiohttp.ClientSession() as http:
        earlier = await _create(http, server, "An earlier task, listed when the page loads.")
        await sign_in_as_admin(page, server)
        await page.wait_for_selector('#tasks[data-live="true"]', state="attached")
        listed = page.locator(f'tr[data-task-id="{earlier["id"]}"] .status')
        await expect(listed).to_have_text("done", timeout=15_000)

        title = '<img src=x onerror="window.__pwned=1"> Quarterly & "more"'
        later = await _create(http, server, "A later task, created while the page is open.", title)
    row = page.locator("#tasks tbody tr").first
    await expect(row).to_have_attribute("data-task-id", later["id"])
    await expect(row.locator("a")).to_have_text(title)
    await expect(row.locator("a")).to_have_attribute("href", f"/tasks/{later['id']}")
    await expect(row.locator("td").first).to_have_text(later["number"])
    await expect(row.locator(".status")).to_have_text("done", timeout=15_000)
    assert await page.locator("#tasks img").count() == 0
    assert await page.evaluate("window.__pwned === undefined")
    assert await page.locator(f'tr[data-task-id="{earlier["id"]}"]').count() == 1
    assert await page.evaluate("window.__cspViolations") == []
    assert page_errors.console == []
    assert page_errors.uncaught == []


async def _create(
    http: aiohttp.ClientSession, server: Any, prompt: str, title: str | None = None
) -> dict[str, Any]:
    body = {"prompt": prompt, "agent_id": str(server.boot.agent_id)}
    if title is not None:
        body["title"] = title
    async with http.post(f"{server.base_url}/api/v1/tasks", json=body, headers=server.auth) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())
