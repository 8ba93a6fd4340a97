"""Finding 9: the web UI's pages and forms take the same rate limits, and leave the same audit
of refusals, as the API does for the same signed-in user; over a real socket, both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from bullpen.domain.principal import Role
from bullpen.store.tables import tasks
from tests.support.db import audits, count
from tests.support.login import SAME_ORIGIN, add_user, sign_in, with_session
from tests.support.servers import RunningServer

PROMPT = "Summarise the open support tickets for the weekly review."
PASSWORD = "correct horse battery staple"
PROBLEM = "application/problem+json"


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client without a cookie jar: cookies go only where a test puts them."""
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


async def get(client: aiohttp.ClientSession, server: RunningServer, path: str, session: str) -> int:
    """The status of a UI page fetched with this session."""
    async with client.get(
        server.base_url + path, headers=with_session(session), allow_redirects=False
    ) as resp:
        await resp.read()
        return resp.status


async def post_task_form(
    client: aiohttp.ClientSession, server: RunningServer, session: str
) -> tuple[int, str, str | None]:
    """Submit the dashboard's task form as its page would: status, body and Retry-After."""
    form = {
        "prompt": PROMPT,
        "agent_id": str(server.boot.agent_id),
        "csrf": server.services.auth.csrf_token(session),
    }
    async with client.post(
        f"{server.base_url}/ui/tasks",
        data=form,
        headers=with_session(session, **SAME_ORIGIN),
        allow_redirects=False,
    ) as resp:
        return resp.status, await resp.text(), resp.headers.get("Retry-After")


@pytest.mark.with_settings(rate_limit_key_rps=0.01, rate_limit_key_burst=4)
async def test_ui_pages_and_forms_spend_the_users_request_budget(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    session = await sign_in(client, server)
    assert await get(client, server, "/", session) == 200
    assert await get(client, server, "/account", session) == 200
    assert (await post_task_form(client, server, session))[0] == 303
    # The API and the UI draw on one budget: the user's.
    async with client.get(f"{server.base_url}/api/v1/tasks", headers=with_session(session)) as resp:
        assert resp.status == 200

    status, body, retry_after = await post_task_form(client, server, session)
    assert status == 429, body
    assert retry_after is not None and int(retry_after) >= 1
    assert await count(server, tasks) == 1  # the refused form created nothing
    assert await get(client, server, "/", session) == 429
    assert await get(client, server, "/account", session) == 429
    async with client.get(server.base_url + "/", headers=with_session(session)) as resp:
        assert resp.headers["Content-Type"] == PROBLEM
        assert (await resp.json(content_type=None))["type"].endswith("/rate-limited")

    # Per user, as in the API: someone else is not held back.
    await add_user(server, "casey@example.com", PASSWORD)
    other = await sign_in(client, server, "casey@example.com", PASSWORD)
    assert await get(client, server, "/", other) == 200


async def test_ui_refusal_is_audited_like_the_apis(
    server: RunningServer, client: aiohttp.ClientSession
) -> None:
    viewer_id = await add_user(server, "val@example.com", PASSWORD, Role.VIEWER)
    session = await sign_in(client, server, "val@example.com", PASSWORD)

    status, html, _ = await post_task_form(client, server, session)
    assert status == 403
    assert "tasks:write" in html  # the dashboard says why
    assert await count(server, tasks) == 0
    denied = await audits(server, "access.denied")
    assert [(d.actor_type, d.actor_id) for d in denied] == [("user", viewer_id)]
    assert denied[0].workspace_id == server.boot.workspace_id
    assert denied[0].data["path"] == "/ui/tasks"
    assert denied[0].data["method"] == "POST"

    # The same refusal through the API leaves the same record.
    async with client.post(
        f"{server.base_url}/api/v1/tasks",
        json={"prompt": PROMPT, "agent_id": str(server.boot.agent_id)},
        headers=with_session(
            session, **SAME_ORIGIN, **{"X-CSRF-Token": server.services.auth.csrf_token(session)}
        ),
    ) as resp:
        assert resp.status == 403
    denied = await audits(server, "access.denied")
    assert [(d.actor_id, d.data["method"]) for d in denied] == [
        (viewer_id, "POST"),
        (viewer_id, "POST"),
    ]
    assert denied[0].data["reason"] == denied[1].data["reason"]
