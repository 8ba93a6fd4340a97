"""The dashboard's settings in a real Chromium on both backends: members and roles, invitations,
API keys shown once, the workspace switcher; each page checked for CSP violations, script
errors and (axe-core) serious or critical accessibility violations; a viewer sees no member
forms and its forged posts are refused."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from playwright.async_api import Browser, BrowserContext, Page, expect

from bullpen.domain.access import Role
from tests.support.browser import CSP_PROBE, TIMEOUT_MS, ContextFactory, PageErrors
from tests.support.dashboard_checks import clean, sign_in
from tests.support.db import audits
from tests.support.login import add_user
from tests.support.team import create_task

pytestmark = [pytest.mark.browser]

PASSWORD = "a long enough member password"  # pragma: allowlist secret
SAME_ORIGIN = {"Sec-Fetch-Site": "same-origin"}


async def api(
    http: aiohttp.ClientSession,
    server: Any,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
) -> tuple[int, Any]:
    """Call the API with the bootstrap admin's key (or `key`); the status and JSON body."""
    headers = {"Authorization": f"Bearer {key}"} if key else server.auth
    async with http.request(method, f"{server.base_url}{path}", json=body, headers=headers) as resp:
        data = await resp.json(content_type=None) if resp.status != 204 else None
        return resp.status, data


async def csrf_of(page: Page) -> str:
    """The page's CSRF token (every signed-in page's sign-out form carries it)."""
    return await page.locator('form.logout input[name="csrf"]').input_value()


async def no_js(browser: Browser, server: Any) -> BrowserContext:
    """A cookie jar in a browser with JavaScript off."""
    ctx = await browser.new_context(base_url=server.base_url, java_script_enabled=False)
    ctx.set_default_timeout(TIMEOUT_MS)
    await ctx.add_init_script(CSP_PROBE)
    return ctx


async def test_members_and_invitations_invite_accept_change_role_remove_and_disable(
    server: Any, page: Page, page_errors: PageErrors, new_context: ContextFactory
) -> None:
    """Invite an email, see the API's answer once, revoke another invitation; the invited
    user accepts and switches in; the owner changes its role, cannot demote or remove the
    last owner (the API's 409 is shown), removes it; an instance admin disables and enables
    an account."""
    async with aiohttp.ClientSession() as http:
        status, _ = await api(
            http,
            server,
            "POST",
            "/api/v1/users",
            {"email": "newbie@example.com", "name": "Newbie", "password": PASSWORD},
        )
        assert status == 201
        _, me = await api(http, server, "GET", "/api/v1/users/me")

        await sign_in(page, server)
        await page.get_by_role("link", name="Settings").click()
        await expect(page).to_have_url(f"{server.base_url}/settings/members")
        owner_row = page.locator(f'tr[data-user-id="{me["id"]}"]')
        await expect(owner_row).to_contain_text("owner")
        await clean(page, page_errors)

        # Invite two emails; the answer is the API's own, shown on the page once.
        await (
            page.get_by_role("navigation", name="Settings")
            .get_by_role("link", name="Invitations")
            .click()
        )
        invite = page.get_by_role("form", name="Invite someone")
        for email, role in (("Newbie@Example.com", "viewer"), ("other@example.com", "admin")):
            await invite.get_by_label("Email").fill(email)
            await invite.get_by_label("Role").select_option(role)
            await invite.get_by_role("button", name="Invite").click()
            await expect(page.get_by_role("heading", name="Invitation created")).to_be_visible()
            shown = await page.locator("#created-invitation").text_content()
            assert shown is not None and f'"email": "{email.lower()}"' in shown
            assert f'"role": "{role}"' in shown
        pending = page.locator("#pending-invitations tbody tr")
        await expect(pending).to_have_count(2)
        await clean(page, page_errors)
        # Reading the page again shows the list, not the answer.
        await page.goto("/settings/invitations")
        await expect(page.locator("#created-invitation")).to_have_count(0)
        await page.get_by_role("button", name="Revoke the invitation of other@example.com").click()
        await expect(page.get_by_role("status")).to_have_text("Invitation revoked.")
        await expect(pending).to_have_count(1)
        await expect(pending.first).to_contain_text("newbie@example.com")
        # An email that is a member already: the API's 409, on the page.
        await invite.get_by_label("Email").fill(server.boot.email)
        await invite.get_by_role("button", name="Invite").click()
        await expect(page.get_by_role("alert")).to_have_text(
            "this email belongs to a member of the workspace already"
        )

        # The invited user accepts (in no workspace yet) and switches to it.
        newbie = await (await new_context()).new_page()
        await sign_in(newbie, server, "newbie@example.com", PASSWORD)
        await newbie.goto("/settings/invitations")
        mine = newbie.locator("#my-invitations tbody tr")
        await expect(mine).to_have_count(1)
        await mine.get_by_role("button", name="Accept").click()
        await expect(newbie.get_by_role("status")).to_contain_text("Invitation accepted")
        await newbie.get_by_label("Workspace").select_option(str(server.boot.workspace_id))
        await newbie.get_by_role("button", name="Switch").click()
        await expect(newbie).to_have_url(f"{server.base_url}/")
        _, listed = await api(http, server, "GET", "/api/v1/members")
        (joined,) = [m for m in listed["items"] if m["email"] == "newbie@example.com"]
        assert joined["role"] == "viewer"

        # The owner changes its role.
        await page.goto("/settings/members")
        row = page.locator(f'tr[data-user-id="{joined["user_id"]}"]')
        await row.get_by_label("Role of newbie@example.com").select_option("member")
        await row.get_by_role("button", name="Change role").click()
        await expect(page.get_by_role("status")).to_have_text("Role changed.")
        await expect(row.locator(".role")).to_have_text("member")
        _, got = await api(http, server, "GET", f"/api/v1/members/{joined['user_id']}")
        assert got["role"] == "member"
        await clean(page, page_errors, 409)

        # The last owner can be neither demoted nor removed: the API's answer, on the page.
        await owner_row.get_by_label(f"Role of {server.boot.email}").select_option("admin")
        await owner_row.get_by_role("button", name="Change role").click()
        await expect(page.get_by_role("alert")).to_have_text(
            "this is the workspace's last owner; make another member owner first"
        )
        await owner_row.get_by_role("button", name="Remove").click()
        await expect(page.get_by_role("alertdialog")).to_contain_text(
            f"Remove {server.boot.email}?"
        )
        await page.get_by_role("button", name="Yes, remove").click()
        await expect(page.get_by_role("alert")).to_have_text(
            "this is the workspace's last owner; it cannot be removed"
        )
        _, got = await api(http, server, "GET", f"/api/v1/members/{me['id']}")
        assert got["role"] == "owner"
        await clean(page, page_errors, 409)

        # Disable an account (instance admin), then enable it again.
        await row.get_by_role("button", name="Disable account").click()
        await expect(page.get_by_role("alertdialog")).to_contain_text(
            "Disable the account of newbie@example.com?"
        )
        await page.get_by_role("button", name="Yes, disable").click()
        await expect(page.get_by_role("status")).to_contain_text("Account disabled")
        await expect(row.locator(".status-disabled")).to_have_text("disabled")
        _, user = await api(http, server, "GET", f"/api/v1/users/{joined['user_id']}")
        assert user["disabled"] is True
        await newbie.reload()  # its session ended with the disabling
        await expect(newbie).to_have_url(f"{server.base_url}/login")
        await row.get_by_role("button", name="Enable account").click()
        await expect(page.get_by_role("status")).to_have_text("Account enabled again.")
        await expect(row.locator(".status-disabled")).to_have_count(0)

        # Remove the member after the confirmation.
        await row.get_by_role("button", name="Remove").click()
        await page.get_by_role("button", name="Yes, remove").click()
        await expect(page.get_by_role("status")).to_contain_text("Member removed")
        await expect(row).to_have_count(0)
        status, _ = await api(http, server, "GET", f"/api/v1/members/{joined['user_id']}")
        assert status == 404
        assert [a.data["email"] for a in await audits(server, "member.remove")] == [
            "newbie@example.com"
        ]


async def test_api_keys_are_shown_once_listed_by_hint_and_refused_once_revoked(
    server: Any, page: Page, page_errors: PageErrors
) -> None:
    """Create a scoped, limited key: it is shown once (sending the form again does not show
    it), works against the API, is listed by its hint only with its last use; revoking it
    asks first, and the API then refuses it (401)."""
    await sign_in(page, server)
    await page.goto("/settings/api-keys")
    form = page.get_by_role("form", name="New API key")
    await form.get_by_label("Name").fill("bad\tname")
    await form.get_by_role("button", name="Create API key").click()
    await expect(page.get_by_role("alert")).to_contain_text("name: String should match pattern")
    await expect(page.locator("#new-key")).to_have_count(0)

    form = page.get_by_role("form", name="New API key")
    await form.get_by_label("Name").fill("ci pipeline")
    await form.get_by_label("tasks:read").check()
    await form.get_by_label("Expires after (days)").fill("30")
    await form.get_by_label("Relay requests per minute").fill("60")
    await form.get_by_role("button", name="Create API key").click()
    field = page.get_by_role("textbox", name="New API key")
    await expect(field).to_have_value(re.compile(r"^bp_"))
    key = await field.input_value()
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await page.get_by_role("button", name="Copy").click()
    await expect(page.locator("#copy-status")).to_have_text("Copied.")
    assert await page.evaluate("navigator.clipboard.readText()") == key
    await clean(page, page_errors, 422)

    async with aiohttp.ClientSession() as http:
        status, body = await api(http, server, "GET", "/api/v1/tasks", key=key)
        assert status == 200, body
        status, _ = await api(http, server, "GET", "/api/v1/agents", key=key)
        assert status == 403  # only tasks:read

        # Read again: only the hint, with the use just made.
        await page.goto("/settings/api-keys")
        assert key not in await page.content()
        row = page.locator("#keys tbody tr", has_text="ci pipeline")
        await expect(row.locator("code.hint")).to_have_text(re.compile(r"^bp_[\w-]+…$"))
        assert key.startswith((await row.locator("code.hint").text_content() or "")[:-1])
        await expect(row).to_contain_text("tasks:read")
        await expect(row).to_contain_text("60 requests/min")
        await expect(row.locator("td").nth(6)).not_to_have_text("never")
        await expect(row.locator(".status")).to_have_text("active")

        # The same form sent twice (a reload): the second answer does not show a key.
        form_fields = {
            "csrf": await csrf_of(page),
            "form_id": await page.locator('input[name="form_id"]').input_value(),
            "name": "sent twice",
        }
        first = await page.request.post(
            "/ui/settings/api-keys", form=form_fields, headers=SAME_ORIGIN
        )
        assert first.status == 201
        assert re.search(r'value="bp_[^"]+"', await first.text())
        again = await page.request.post(
            "/ui/settings/api-keys", form=form_fields, headers=SAME_ORIGIN
        )
        assert again.status == 200
        text = await again.text()
        assert "bp_" not in text.replace('<code class="hint">bp_', "")
        assert "its key was shown then, once" in text
        _, listed = await api(http, server, "GET", "/api/v1/api-keys")
        assert [k["name"] for k in listed["items"]].count("sent twice") == 1

        # Revoke after the confirmation; the API refuses the key at once.
        await page.reload()
        await row.get_by_role("button", name="Revoke ci pipeline").click()
        await expect(page.get_by_role("alertdialog")).to_contain_text(
            "Revoke the key “ci pipeline”"
        )
        await page.get_by_role("link", name="No, keep it").click()
        await expect(row.locator(".status")).to_have_text("active")
        await row.get_by_role("button", name="Revoke ci pipeline").click()
        await page.get_by_role("button", name="Yes, revoke").click()
        await expect(page.get_by_role("status")).to_have_text(
            "API key revoked: it stops working at once."
        )
        await expect(row.locator(".status")).to_have_text("revoked")
        await expect(row.get_by_role("button", name="Revoke ci pipeline")).to_have_count(0)
        status, _ = await api(http, server, "GET", "/api/v1/tasks", key=key)
        assert status == 401
    await clean(page, page_errors, 422)


async def test_a_viewer_sees_no_member_forms_and_its_forged_posts_are_refused(
    server: Any, browser: Browser
) -> None:
    """Without JavaScript, a viewer sees members and its own keys but no role, remove or
    invitation form; the server refuses (403, audited) what it forges; its own key is shown
    once as a read-only field, the Copy button (a script's) absent."""
    viewer_id = await add_user(server, "viewer@example.com", PASSWORD, Role.VIEWER)
    ctx = await no_js(browser, server)
    try:
        tab = await ctx.new_page()
        await sign_in(tab, server, "viewer@example.com", PASSWORD)
        await tab.goto("/settings/members")
        await expect(tab.locator("#members tbody tr")).to_have_count(2)
        for button in ("Change role", "Remove", "Disable account"):
            await expect(tab.get_by_role("button", name=button)).to_have_count(0)
        await tab.goto("/settings/invitations")
        await expect(tab.get_by_role("form", name="Invite someone")).to_have_count(0)
        await expect(tab.locator("#pending-invitations")).to_have_count(0)

        csrf = await csrf_of(tab)
        async with aiohttp.ClientSession() as http:
            _, me = await api(http, server, "GET", "/api/v1/users/me")
            forged = [
                (f"/ui/settings/members/{me['id']}/role", {"role": "viewer"}),
                (f"/ui/settings/members/{me['id']}/remove", {"confirmed": "yes"}),
                ("/ui/settings/invitations", {"email": "x@example.com", "role": "admin"}),
            ]
            for path, fields in forged:
                refused = await tab.request.post(
                    path, form={"csrf": csrf, **fields}, headers=SAME_ORIGIN
                )
                assert refused.status == 403, path
                assert "this needs the `members:write` permission" in await refused.text()
            _, got = await api(http, server, "GET", f"/api/v1/members/{me['id']}")
            assert got["role"] == "owner"
            _, pending = await api(http, server, "GET", "/api/v1/invitations")
            assert pending["items"] == []
        denied = await audits(server, "access.denied")
        assert len([a for a in denied if a.actor_id == viewer_id]) == 3
        # Without the page's CSRF token, nothing is even tried.
        stray = await tab.request.post(
            f"/ui/settings/members/{viewer_id}/role",
            form={"csrf": "forged", "role": "owner"},
            headers=SAME_ORIGIN,
        )
        assert stray.status == 403

        # A viewer may hold keys of its own: shown once, as text to select and copy.
        await tab.goto("/settings/api-keys")
        await tab.get_by_label("Name").fill("laptop")
        await tab.get_by_role("button", name="Create API key").click()
        field = tab.get_by_role("textbox", name="New API key")
        await expect(field).to_have_value(re.compile(r"^bp_"))
        await expect(field).to_have_attribute("readonly", "")
        await expect(tab.locator("button.copy")).to_be_hidden()
        async with aiohttp.ClientSession() as http:
            own = await field.input_value()
            status, _ = await api(http, server, "GET", "/api/v1/tasks", key=own)
            assert status == 200
    finally:
        await ctx.close()


async def test_the_workspace_switcher_shows_only_the_chosen_workspaces_tasks(
    server: Any, page: Page, page_errors: PageErrors, new_context: ContextFactory
) -> None:
    """A member of two workspaces switches between them (audited); each shows its own tasks
    only; a workspace it is not in cannot be chosen; a user of one workspace sees no switcher."""
    default = str(server.boot.workspace_id)
    async with aiohttp.ClientSession() as http:
        ws = {"name": "Research", "slug": "research", "task_key": "RS"}
        status, research = await api(http, server, "POST", "/api/v1/workspaces", ws)
        assert status == 201, research
        body = {"name": "research", "workspace_id": research["id"]}
        status, made = await api(http, server, "POST", "/api/v1/api-keys", body)
        assert status == 201, made
        agent = {"name": "analyst", "config": {"provider": "simulated", "model": "sim-1"}}
        status, analyst = await api(http, server, "POST", "/api/v1/agents", agent, made["key"])
        assert status == 201, analyst
        task = {"title": "Research only", "prompt": "Count the papers.", "agent_id": analyst["id"]}
        status, _ = await api(http, server, "POST", "/api/v1/tasks", task, made["key"])
        assert status == 201
        demo = {"id": str(server.boot.agent_id)}
        await create_task(http, server, demo, "Sum the invoices.", title="Default only")

    await sign_in(page, server)
    tasks = page.locator("#tasks")
    await expect(tasks).to_contain_text("Default only")
    await expect(tasks).not_to_contain_text("Research only")
    picker = page.get_by_label("Workspace")
    await expect(picker).to_have_value(default)
    await picker.select_option(label="Research")
    await page.get_by_role("button", name="Switch").click()
    await expect(page).to_have_url(f"{server.base_url}/")
    await expect(page.get_by_label("Workspace")).to_have_value(research["id"])
    await expect(tasks).to_contain_text("Research only")
    await expect(tasks).not_to_contain_text("Default only")
    await clean(page, page_errors)
    (moved,) = await audits(server, "session.switch_workspace")
    assert str(moved.workspace_id) == research["id"]
    assert moved.data == {"from_workspace_id": default}

    # Only its memberships: another workspace's id is 404 and the session stays put.
    await add_user(server, "solo@example.com", PASSWORD)
    solo = await (await new_context()).new_page()
    await sign_in(solo, server, "solo@example.com", PASSWORD)
    await expect(solo.get_by_label("Workspace")).to_have_count(0)
    refused = await solo.request.post(
        "/ui/workspace",
        form={"csrf": await csrf_of(solo), "workspace_id": research["id"]},
        headers=SAME_ORIGIN,
    )
    assert refused.status == 404
    await solo.reload()
    await expect(solo.locator("#tasks")).to_contain_text("Default only")
    unsigned = await page.request.post(
        "/ui/workspace", form={"workspace_id": default}, headers=SAME_ORIGIN
    )
    assert unsigned.status == 403  # no CSRF token
    await page.get_by_label("Workspace").select_option(default)
    await page.get_by_role("button", name="Switch").click()
    await expect(tasks).to_contain_text("Default only")
    assert len(await audits(server, "session.switch_workspace")) == 2
