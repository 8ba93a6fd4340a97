"""The routine page's edit form, server side, over real sockets on both backends: a post
changes only the fields it carries that differ (one audit event listing them), an unchecked
`enabled` pauses, and a refused value is the API's own message with its status, the routine
unchanged."""

from __future__ import annotations

import html
import re
import uuid
from typing import Any

import aiohttp

from tests.support.http import call
from tests.support.login import SAME_ORIGIN, sign_in, with_session
from tests.support.servers import RunningServer

PROMPT = "Write the weekly digest of the open tasks."
ALERT = re.compile(r'<p class="error" role="alert">([^<]*)</p>')


async def routine(http: aiohttp.ClientSession, server: RunningServer, name: str) -> str:
    made = await call(
        http,
        server,
        "POST",
        "/api/v1/routines",
        body={
            "name": name,
            "agent_id": str(server.boot.agent_id),
            "cron": "0 9 * * 1",
            "timezone": "UTC",
            "prompt": PROMPT,
            "title": "Weekly digest",
            "labels": ["ops", "weekly"],
            "concurrency": "queue",
        },
    )
    assert made.status == 201, made.text
    return str(made.body["id"])


async def edit(
    http: aiohttp.ClientSession, server: RunningServer, session: str, routine_id: str, **form: str
) -> tuple[int, str, str | None]:
    """Post the edit form; (status, page, the alert's text if any)."""
    data = {"csrf": server.services.auth.csrf_token(session), "action": "save", **form}
    async with http.post(
        f"{server.base_url}/ui/routines/{routine_id}",
        data=data,
        headers=with_session(session, **SAME_ORIGIN),
        allow_redirects=False,
    ) as resp:
        text = await resp.text()
        alert = ALERT.search(text)
        return resp.status, text, html.unescape(alert.group(1)) if alert else None


async def stored(http: aiohttp.ClientSession, server: RunningServer, routine_id: str) -> Any:
    got = await call(http, server, "GET", f"/api/v1/routines/{routine_id}")
    assert got.status == 200
    return got.body


async def updates(http: aiohttp.ClientSession, server: RunningServer, routine_id: str) -> Any:
    got = await call(
        http,
        server,
        "GET",
        f"/api/v1/audit-events?action=routine.update&target_id={routine_id}",
    )
    assert got.status == 200
    return got.body["items"]


async def test_an_edit_changes_only_what_differs_and_refuses_as_the_api(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    routine_id = await routine(http, server, "weekly-digest")
    await routine(http, server, "taken")
    before = await stored(http, server, routine_id)
    session = await sign_in(http, server)

    # The whole form as the page fills it, with only the priority changed.
    full = {
        "name": "weekly-digest",
        "agent_id": str(server.boot.agent_id),
        "cron": "0 9 * * 1",
        "timezone": "UTC",
        "prompt": PROMPT,
        "title": "Weekly digest",
        "priority": "5",
        "labels": "ops, weekly",
        "concurrency": "queue",
        "catch_up": "latest",
        "enabled": "on",
    }
    status, _, alert = await edit(http, server, session, routine_id, **full)
    assert (status, alert) == (303, None)
    after = await stored(http, server, routine_id)
    assert after == {**before, "priority": 5, "updated_at": after["updated_at"]}
    [event] = await updates(http, server, routine_id)
    assert event["data"] == {"before": {"priority": 0}, "after": {"priority": 5}}

    # Unchanged: no event. A post that carries only the cron changes only the schedule.
    assert (await edit(http, server, session, routine_id, **full))[0] == 303
    assert len(await updates(http, server, routine_id)) == 1
    assert (await edit(http, server, session, routine_id, cron="30 8 * * *"))[0] == 303
    after = await stored(http, server, routine_id)
    assert (after["cron"], after["title"], after["labels"]) == (
        "30 8 * * *",
        "Weekly digest",
        ["ops", "weekly"],
    )
    assert after["next_fire_at"] != before["next_fire_at"]

    # The checkbox unchecked (only the hidden empty value sent): paused.
    status, _, _ = await edit(http, server, session, routine_id, enabled="")
    after = await stored(http, server, routine_id)
    assert status == 303 and after["enabled"] is False and after["next_fire_at"] is None

    # Refused values: the API's message and status, the form kept as typed, nothing changed.
    refusals: list[tuple[dict[str, str], int]] = [
        ({"title": ""}, 422),
        ({"priority": "high"}, 422),
        ({"cron": "61 * * * *"}, 422),
        ({"cron": "0 9 * *"}, 422),
        ({"timezone": "Mars/Olympus_Mons"}, 422),
        ({"concurrency": "sometimes"}, 422),
        ({"agent_id": str(uuid.uuid4())}, 404),
        ({"name": "taken"}, 409),
    ]
    for form, code in refusals:
        api = await call(http, server, "PATCH", f"/api/v1/routines/{routine_id}", body=form)
        assert api.status == code, (form, api.text)
        status, page, alert = await edit(http, server, session, routine_id, **form)
        assert status == code, (form, page)
        if code == 422 and api.body.get("errors"):
            expected = "; ".join(f"{e['field']}: {e['message']}" for e in api.body["errors"])
        else:
            expected = api.body["detail"]
        assert alert == expected, (form, alert, api.body)
        [(field, value)] = form.items()
        if field in ("title", "priority", "cron", "timezone", "name"):  # typed: kept as typed
            assert f'name="{field}" value="{html.escape(value)}"' in page, (form, page)
    assert await stored(http, server, routine_id) == after
    assert len(await updates(http, server, routine_id)) == 3

    # Another workspace's routine, or none: 404, nothing shown.
    status, _, _ = await edit(http, server, session, str(uuid.uuid4()), cron="* * * * *")
    assert status == 404
