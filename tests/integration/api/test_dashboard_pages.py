"""The dashboard's server side over real sockets, on both backends: the task list's keyset
pages and literal search, htmx fragments, and refusals rendered as pages."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

from bullpen.api.routes.ui_tasks import PAGE_SIZE
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
