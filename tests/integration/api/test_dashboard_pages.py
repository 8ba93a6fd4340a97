"""The dashboard's server side over real sockets, on both backends: the task list's keyset
pages and literal search, htmx fragments, and refusals rendered as pages."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from bullpen.api.routes.ui_tasks import PAGE_SIZE
from bullpen.store import gateway as gateway_store
from tests.support.login import SAME_ORIGIN, sign_in, with_session
from tests.support.servers import RunningServer

ROW = re.compile(r'<tr data-task-id="([0-9a-f-]{36})">')
NEXT = re.compile(r'<a href="(/\?[^"]*cursor=[^"]+)"')


async def _gated(http: aiohttp.ClientSession, server: RunningServer) -> str:
    body = {
        "name": "gate",
        "requires_approval": True,
        "config": {"provider": "simulated", "model": "sim-1"},
    }
    async with http.post(f"{server.base_url}/api/v1/agents", json=body, headers=server.auth) as r:
        assert r.status == 201, await r.text()
        return str((await r.json())["id"])


async def _page(
    http: aiohttp.ClientSession, server: RunningServer, session: str, path: str, **headers: Any
) -> tuple[int, str]:
    async with http.get(
        f"{server.base_url}{path}", headers=with_session(session, **SAME_ORIGIN, **headers)
    ) as resp:
        return resp.status, await resp.text()


async def test_task_list_pages_by_keyset_and_searches_literally(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """PAGE_SIZE + 1 tasks make two pages with no task twice; `%` and `_` in a search are
    text, not wildcards; an htmx request gets the list alone; a bad filter is a 422 page."""
    gate = await _gated(http, server)
    made = []
    for n in range(PAGE_SIZE + 1):
        prompt = "A 100% literal search target" if n == 7 else f"Task number {n} of the batch."
        async with http.post(
            f"{server.base_url}/api/v1/tasks",
            json={"prompt": prompt, "agent_id": gate},
            headers=server.auth,
        ) as resp:
            assert resp.status == 201
            made.append((await resp.json())["id"])
    session = await sign_in(http, server)

    status, html = await _page(http, server, session, "/")
    assert status == 200
    first = ROW.findall(html)
    assert first == list(reversed(made))[:PAGE_SIZE]
    link = NEXT.search(html)
    assert link is not None
    status, html = await _page(http, server, session, link.group(1).replace("&amp;", "&"))
    assert status == 200 and ROW.findall(html) == [made[0]] and NEXT.search(html) is None

    _, html = await _page(http, server, session, "/?q=100%25")
    assert ROW.findall(html) == [made[7]]
    _, html = await _page(http, server, session, "/?q=1_0")  # `_` is no wildcard
    assert ROW.findall(html) == []

    status, fragment = await _page(http, server, session, "/?q=100%25", **{"HX-Request": "true"})
    assert status == 200 and fragment.lstrip().startswith('<div id="task-list">')
    assert "<nav" not in fragment and ROW.findall(fragment) == [made[7]]

    status, html = await _page(http, server, session, "/?status=nonsense")
    assert status == 422 and "unknown status" in html
    # Shorter than a trigram: no index could serve it, so it is refused, not scanned for.
    status, html = await _page(http, server, session, "/?q=%2010%20")
    assert status == 422 and "search: at least 3 characters" in html
    _, html = await _page(http, server, session, "/?q=100")
    assert ROW.findall(html) == [made[7]]


async def test_costs_page_of_many_groups_lists_every_total_and_the_charted_days(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """170 models over 30 days are 5,100 day rows, more than one costs answer holds: the page
    still answers, with every model's total, and per day only the 10 largest spenders (the
    ones its charts draw). Grouped by agent, relay calls (no agent) are one of the groups."""
    ws, agent = server.boot.workspace_id, server.boot.agent_id
    start = datetime(2026, 11, 1, 12, tzinfo=UTC)
    rows = [
        {
            "workspace_id": ws,
            "run_id": None,
            "agent_id": None if model % 2 else agent,
            "user_id": None,
            "api_key_id": None,
            "provider": "p",
            "model": f"m{model:03d}",
            "input_tokens": 10,
            "cached_input_tokens": 0,
            "output_tokens": 5,
            "cost_usd": 0.001 * (model + 1),
            "created_at": start + timedelta(days=day),
        }
        for model in range(170)
        for day in range(30)
    ]
    async with server.services.store.write() as conn:
        await gateway_store.record_costs(conn, rows)
    session = await sign_in(http, server)
    status, html = await _page(
        http, server, session, "/costs?group=model&since=2026-11-01&until=2026-11-30"
    )
    assert status == 200, html[:2000]
    totals = re.findall(r'<tr data-key="(m\d+)"><th', html)
    assert len(totals) == 170 and totals[:3] == ["m169", "m168", "m167"]  # largest first
    per_day = set(re.findall(r'<tr data-day="[\d-]+" data-key="(m\d+)"', html))
    assert per_day == {f"m{m}" for m in range(160, 170)}
    assert len(re.findall(r'<tr data-day="', html)) == 10 * 30  # the spend and tokens table

    status, html = await _page(
        http, server, session, "/costs?group=agent&since=2026-11-01&until=2026-11-30"
    )
    assert status == 200, html[:2000]
    assert set(re.findall(r'<tr data-day="[\d-]+" data-key="([^"]*)"', html)) == {"", str(agent)}
