"""The workspace stream over real sockets, on both backends: every task's creation and status
change live and in order, resumable after any event, only the caller's workspace, one poller
per workspace however many readers, and the stream limits."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from bullpen.streams.changes import parse_cursor
from tests.support.http import call, problem_of
from tests.support.servers import RunningServer
from tests.support.sse import Event, read_events
from tests.support.streams import (
    open_stream,
    other_workspace_task,
    subscribers_drop_to,
)
from tests.support.tasks import new_task
from tests.support.team import create_task, delegate, finish, get_task, make_agent


def url(server: RunningServer) -> str:
    return f"{server.base_url}/api/v1/events"


def of_task(events: list[Event], task: dict[str, Any]) -> list[tuple[str | None, str]]:
    mine = [e.data for e in events if e.data["task_id"] == task["id"]]
    return [(data["previous"], data["status"]) for data in mine]


def ended(*tasks: dict[str, Any]) -> Any:
    """A stop condition: each task's change to a final status has arrived."""
    ids = {t["id"] for t in tasks}

    def check(events: list[Event]) -> bool:
        done = {e.data["task_id"] for e in events if e.data["status"] in ("done", "failed")}
        return ids <= done

    return check


async def polls_stop(server: RunningServer, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while server.services.feeds.running:
        assert time.monotonic() < deadline, "a workspace poller outlived its readers"
        await asyncio.sleep(0.02)


async def test_changes_arrive_live_in_order_and_resume_after_any_event(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    their_task, _, _ = await other_workspace_task(server)  # never in this workspace's stream
    # A stream from now on: it holds its place (the poller started) once the response starts.
    resp = await open_stream(http, url(server), server.auth)
    resp.close()
    first = await new_task(http, server, title="first")
    second = await new_task(http, server, title="second")
    async with asyncio.timeout(20):
        live = await read_events(
            http, url(server), {**server.auth, "Last-Event-ID": "0-0"}, until=ended(first, second)
        )
    assert their_task not in {e.data["task_id"] for e in live}
    for task in (first, second):
        assert of_task(live, task) == [(None, "queued"), ("queued", "running"), ("running", "done")]
    created = next(e for e in live if e.data["task_id"] == first["id"])
    assert created.event == "task"
    assert created.data == {
        "task_id": first["id"],
        "number": first["number"],
        "parent_id": None,
        "agent_id": first["agent_id"],
        "status": "queued",
        "previous": None,
        "at": created.data["at"],
        "title": "first",
    }
    ids = [e.id for e in live]
    assert len(set(ids)) == len(ids)
    for k in sorted({0, 1, len(live) // 2, len(live) - 2}):
        assert live[k].id is not None
        async with asyncio.timeout(20):
            rest = await read_events(
                http,
                url(server),
                {**server.auth, "Last-Event-ID": live[k].id},
                stop_after=len(live) - k - 1,
            )
        assert [(e.id, e.data) for e in rest] == [(e.id, e.data) for e in live[k + 1 :]], k
    # `after` starts there too, for clients that cannot send headers; `Last-Event-ID` wins.
    async with asyncio.timeout(20):
        rest = await read_events(
            http, f"{url(server)}?after={live[1].id}", server.auth, stop_after=len(live) - 2
        )
        assert [e.id for e in rest] == [e.id for e in live[2:]]
        rest = await read_events(
            http,
            f"{url(server)}?after={live[1].id}",
            {**server.auth, "Last-Event-ID": str(live[-2].id)},
            stop_after=1,
        )
        assert [e.id for e in rest] == [live[-1].id]
    await subscribers_drop_to(server, 0)
    await polls_stop(server)


async def test_a_stream_without_last_event_id_starts_from_now(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    before = await new_task(http, server)
    async with asyncio.timeout(20):
        await read_events(
            http, url(server), {**server.auth, "Last-Event-ID": "0"}, until=ended(before)
        )
    reader = asyncio.create_task(read_events(http, url(server), server.auth, stop_after=1))
    await subscribers_drop_to(server, 1)
    after = await new_task(http, server)
    async with asyncio.timeout(20):
        events = await reader
    assert [e.data["task_id"] for e in events] == [after["id"]]


async def test_one_poller_per_workspace_however_many_readers(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    feeds = server.services.feeds
    streams = [await open_stream(http, url(server), server.auth) for _ in range(5)]
    assert feeds.running == 1
    assert server.services.bus.subscriber_count == 5  # counted against the stream limits
    feed = feeds.feed_of(server.boot.workspace_id)
    assert feed is not None
    polls = feed.polls
    await asyncio.sleep(1.0)
    # 0.25 s apart when nothing happens: a handful, not one per reader per interval.
    assert 1 <= feed.polls - polls <= 8
    for resp in streams:
        resp.close()
    await subscribers_drop_to(server, 0)
    await polls_stop(server)


async def test_bad_last_event_ids_are_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for bad in ("abc", "1.2", "~12", "-1-2", "1-", "1-2-3", "12345678901234567890-1", ""):
        async with http.get(url(server), headers={**server.auth, "Last-Event-ID": bad}) as resp:
            body = await problem_of(resp, 422)
        assert any("last-event-id" in str(e).lower() for e in body["errors"]), body
    async with http.get(f"{url(server)}?after=x-1", headers=server.auth) as resp:
        body = await problem_of(resp, 422)
        assert body["errors"][0]["field"].startswith("after"), body
    async with http.get(url(server)) as resp:
        await problem_of(resp, 401)
    await subscribers_drop_to(server, 0)
    assert server.services.feeds.running == 0


@pytest.mark.with_settings(sse_max_subscribers_per_workspace=2)
async def test_workspace_streams_count_against_the_limits(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    held = [
        await open_stream(http, url(server), server.auth),
        await open_stream(http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth),
    ]
    async with http.get(url(server), headers=server.auth) as resp:
        body = await problem_of(resp, 429)
        assert resp.headers["Retry-After"] == "1"
    assert "limit" in body["detail"]
    for resp in held:
        resp.close()
    await subscribers_drop_to(server, 0)
    assert (await call(http, server, "GET", "/api/v1/events/x")).status == 404


# --- a task's stream with its subtasks ------------------------------------------------------


async def test_a_tasks_stream_with_subtasks_carries_its_trees_changes_and_resumes(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    lead = await make_agent(
        http,
        server,
        "lead",
        [
            {"tool_calls": [delegate("analyst", "Analyse part A")]},
            {"tool_calls": [finish("LEAD: {{context}}")]},
        ],
    )
    analyst = await make_agent(
        http,
        server,
        "analyst",
        [
            {"tool_calls": [delegate("researcher", "Dig into part A")]},
            {"tool_calls": [finish("ANALYST: {{context}}")]},
        ],
        reports_to=lead["id"],
    )
    await make_agent(http, server, "researcher", reports_to=analyst["id"])
    await new_task(http, server)  # another task of the workspace: not in the tree
    task = await create_task(http, server, lead, "Write the quarterly report")
    tree_url = f"{server.base_url}/api/v1/tasks/{task['id']}/events?subtasks=true"
    async with asyncio.timeout(30):
        events = await read_events(http, tree_url, server.auth, markers=True)
    assert (await get_task(http, server, task["id"]))["status"] == "done"
    assert events[-1].event == "close" and events[-1].id is None
    changes = [e for e in events if e.event == "task"]
    by_task: dict[str, list[str]] = {}
    for e in changes:
        by_task.setdefault(e.data["task_id"], []).append(e.data["status"])
    assert len(by_task) == 3  # the lead's task, the analyst's, the researcher's
    assert by_task[task["id"]] == ["queued", "running", "blocked", "queued", "running", "done"]
    kids = [t for t in by_task if t != task["id"]]
    for kid in kids:
        assert by_task[kid][-1] == "done"
    parents = {e.data["task_id"]: e.data["parent_id"] for e in changes}
    assert sorted(parents.values(), key=str) == sorted(
        [None, task["id"], next(k for k in kids if parents[k] == task["id"])], key=str
    )
    # The lead's final change comes before the close; the runs are all there as well.
    assert changes[-1].data["task_id"] == task["id"]
    assert [e.data["number"] for e in events if e.event == "run"] == [1, 2]
    # Every id carries both positions, and neither part ever goes back.
    ids = [e.id for e in events if e.id is not None]
    parts = [i.split("~") for i in ids]
    runs = [tuple(int(x) for x in p[0].split(".")) for p in parts]
    logs = [parse_cursor(p[1]) for p in parts]
    assert runs == sorted(runs) and logs == sorted(logs) and len(set(ids)) == len(ids)
    # A resume after any event gives exactly the rest of each part, in order (how the two
    # parts interleave depends on timing; the markers aside).
    with_ids = [e for e in events if e.id is not None]
    for k in sorted({0, 3, len(with_ids) // 2, len(with_ids) - 2}):
        async with asyncio.timeout(20):
            rest = await read_events(
                http, tree_url, {**server.auth, "Last-Event-ID": with_ids[k].id or ""}
            )
        assert len(rest) == len(with_ids) - k - 1
        for part in (True, False):
            assert [e.data for e in rest if (e.event == "task") is part] == [
                e.data for e in with_ids[k + 1 :] if (e.event == "task") is part
            ], k
    # Without `subtasks` the same task's stream has no `task` events, and takes the task part
    # of such an id.
    async with asyncio.timeout(20):
        plain = await read_events(
            http,
            f"{server.base_url}/api/v1/tasks/{task['id']}/events",
            {**server.auth, "Last-Event-ID": with_ids[0].id or ""},
        )
    assert plain and all(e.event != "task" and "~" not in (e.id or "") for e in plain)
    await subscribers_drop_to(server, 0)
    await polls_stop(server)
