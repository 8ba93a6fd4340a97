"""Changing tasks through the API: update, filters, cancel, retry, comments, runs, audit, limits."""

from __future__ import annotations

import time
import uuid
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.store.tables import audit_events, task_comments, tasks
from tests.support.http import bearer, call, problem, problem_of
from tests.support.seed import new_member
from tests.support.servers import RunningServer
from tests.support.sse import read_events
from tests.support.tasks import new_task, wait_status

SLOW_FIRST_TOKEN = {"sim_ttft_ms": 20_000.0}


async def audit_actions(server: RunningServer, target: str) -> list[str]:
    async with server.services.store.read() as conn:
        rows = await conn.execute(
            sa.select(audit_events.c.action)
            .where(audit_events.c.target_id == uuid.UUID(target))
            .order_by(audit_events.c.created_at)
        )
        return [row.action for row in rows]


async def test_update_changes_only_what_is_sent_and_is_audited(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server, title="First", priority=3, labels=["a"])
    assert (task["title"], task["priority"], task["labels"]) == ("First", 3, ["a"])
    path = f"/api/v1/tasks/{task['id']}"
    reply = await call(http, server, "PATCH", path, body={"labels": ["q3", "ops"]})
    updated = reply.body
    assert reply.status == 200
    assert updated["labels"] == ["q3", "ops"] and updated["title"] == "First"
    updated = (await call(http, server, "PATCH", path, body={"title": "  Renamed  "})).body
    assert updated["title"] == "Renamed" and updated["priority"] == 3
    assert await audit_actions(server, task["id"]) == ["task.create", "task.update", "task.update"]
    async with server.services.store.read() as conn:
        data = (
            await conn.execute(
                sa.select(audit_events.c.data).where(audit_events.c.action == "task.update")
            )
        ).first()
    assert data is not None and data.data == {
        "before": {"labels": ["a"]},
        "after": {"labels": ["q3", "ops"]},
    }


@pytest.mark.parametrize(
    "body",
    [
        {"title": None},
        {"status": "done"},
        {"prompt": "changed prompt text"},
        {"priority": 101},
        {"priority": "5"},
        {"labels": ["bad label"]},
        {"labels": [f"l{n}" for n in range(21)]},
        {"title": "line\nbreak"},
        {"title": ""},
    ],
)
async def test_bad_or_privileged_updates_are_422_and_change_nothing(
    server: RunningServer, http: aiohttp.ClientSession, body: dict[str, Any]
) -> None:
    task = await new_task(http, server)
    async with http.patch(
        f"{server.base_url}/api/v1/tasks/{task['id']}", json=body, headers=server.auth
    ) as resp:
        refused = await problem_of(resp, 422)
    assert refused["errors"]
    after = (await call(http, server, "GET", f"/api/v1/tasks/{task['id']}")).body
    assert {k: after[k] for k in ("title", "priority", "labels", "prompt")} == {
        k: task[k] for k in ("title", "priority", "labels", "prompt")
    }


async def test_list_filters_by_status_agent_and_label(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    tagged = await new_task(http, server, labels=["red", "blue"])
    await new_task(http, server, labels=["blue"])
    await wait_status(http, server, tagged["id"], "done")

    async def ids(**params: str) -> list[str]:
        async with http.get(
            f"{server.base_url}/api/v1/tasks", params=params, headers=server.auth
        ) as resp:
            assert resp.status == 200, await resp.text()
            return [item["id"] for item in (await resp.json())["items"]]

    assert await ids(label="red") == [tagged["id"]]
    assert len(await ids(label="blue")) == 2
    assert await ids(label="green") == []
    assert len(await ids(agent_id=str(server.boot.agent_id))) == 2
    assert await ids(agent_id=str(uuid.uuid4())) == []
    assert tagged["id"] in await ids(status="done")
    async with http.get(
        f"{server.base_url}/api/v1/tasks", params={"status": "nope"}, headers=server.auth
    ) as resp:
        await problem_of(resp, 422)


@pytest.mark.with_settings(**SLOW_FIRST_TOKEN)
async def test_cancel_a_running_task_stops_it_within_a_second(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    await wait_status(http, server, task["id"], "running")
    started = time.monotonic()
    reply = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/cancel")
    cancelled = reply.body
    assert reply.status == 200 and time.monotonic() - started < 1.0
    assert cancelled["status"] == "cancelled" and cancelled["run"]["status"] == "cancelled"
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
    )
    assert events[-1].event == "end" and events[-1].data == {"status": "cancelled"}
    # Twice is a no-op; a finished task cannot be cancelled.
    assert (await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/cancel")).status == 200
    assert await audit_actions(server, task["id"]) == ["task.create", "task.cancel"]


@pytest.mark.with_settings(worker_enabled=False)
async def test_cancel_a_queued_task_ends_its_run_and_stream_at_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    reply = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/cancel")
    cancelled = reply.body
    assert reply.status == 200 and cancelled["status"] == "cancelled"
    assert cancelled["run"]["status"] == "cancelled" and cancelled["run"]["finished_at"]
    url = f"{server.base_url}/api/v1/tasks/{task['id']}/events"
    events = await read_events(http, url, server.auth)
    assert [(e.id, e.event, e.data) for e in events] == [("1.1", "end", {"status": "cancelled"})]
    reply = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/retry")
    retried = reply.body
    assert reply.status == 201 and retried["status"] == "queued"
    assert retried["run"]["status"] == "queued" and retried["run"]["id"] != task["run"]["id"]


async def test_retry_queues_a_new_run_and_finished_tasks_refuse_cancel(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    done = await wait_status(http, server, task["id"], "done")
    reply = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/cancel")
    assert problem(reply, 409)["type"].endswith("/conflict")
    problem(await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/retry"), 409)
    async with server.services.store.write() as conn:  # as if it had failed
        await conn.execute(
            tasks.update().where(tasks.c.id == uuid.UUID(task["id"])).values(status="failed")
        )
    retried = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/retry")
    assert retried.status == 201 and retried.body["run"]["id"] != done["run"]["id"]
    await wait_status(http, server, task["id"], "done")
    reply = await call(http, server, "GET", f"/api/v1/tasks/{task['id']}/runs")
    runs = reply.body["items"]
    assert reply.status == 200 and [r["status"] for r in runs] == ["done", "done"]
    assert runs[0]["id"] == done["run"]["id"]
    run = await call(http, server, "GET", f"/api/v1/runs/{runs[1]['id']}")
    assert run.status == 200
    assert run.body["task_id"] == task["id"] and run.body["output_tokens"] > 0
    assert (await call(http, server, "GET", f"/api/v1/runs/{uuid.uuid4()}")).status == 404


async def test_comments_are_added_listed_and_paginated(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    path = f"/api/v1/tasks/{task['id']}/comments"
    for n in range(5):
        comment = await call(http, server, "POST", path, body={"body": f"note {n}"})
        assert comment.status == 201 and comment.body["body"] == f"note {n}"
        assert comment.body["author_type"] == "api_key"
    page = (await call(http, server, "GET", path + "?limit=3")).body
    assert [c["body"] for c in page["items"]] == ["note 0", "note 1", "note 2"]
    rest = (await call(http, server, "GET", path + f"?limit=3&cursor={page['next_cursor']}")).body
    assert [c["body"] for c in rest["items"]] == ["note 3", "note 4"]
    assert rest["next_cursor"] is None
    assert (await call(http, server, "POST", path, body={"body": ""})).status == 422
    bad = {"body": "x", "author_id": "y"}
    assert (await call(http, server, "POST", path, body=bad)).status == 422
    missing = f"/api/v1/tasks/{uuid.uuid4()}/comments"
    assert (await call(http, server, "POST", missing, body={"body": "x"})).status == 404
    async with server.services.store.read() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).select_from(task_comments))).scalar()
    assert count == 5


async def test_audit_log_lists_changes_newest_first_with_filters(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    first = await new_task(http, server)
    await new_task(http, server)
    await call(http, server, "PATCH", f"/api/v1/tasks/{first['id']}", body={"priority": 1})
    reply = await call(http, server, "GET", "/api/v1/audit-events?limit=2")
    page = reply.body
    assert reply.status == 200
    assert [e["action"] for e in page["items"]] == ["task.update", "task.create"]
    assert page["next_cursor"]
    only = (await call(http, server, "GET", f"/api/v1/audit-events?target_id={first['id']}")).body
    assert [e["action"] for e in only["items"]] == ["task.update", "task.create"]
    assert {(e["actor_type"], e["actor_id"]) for e in only["items"]} == {
        ("api_key", only["items"][0]["actor_id"])
    }
    creates = (await call(http, server, "GET", "/api/v1/audit-events?action=task.create")).body
    assert len(creates["items"]) == 2


async def test_members_cannot_read_the_audit_log_and_the_denial_is_audited(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    _, key_id, key = await new_member(server, Role.MEMBER, "m@x")
    refused = problem(await call(http, server, "GET", "/api/v1/audit-events", bearer(key)), 403)
    assert "audit:read" in refused["detail"]
    page = (await call(http, server, "GET", "/api/v1/audit-events?action=access.denied")).body
    assert [(e["actor_id"], e["data"]["path"]) for e in page["items"]] == [
        (str(key_id), "/api/v1/audit-events")
    ]
    assert "audit:read" in page["items"][0]["data"]["reason"]


@pytest.mark.with_settings(rate_limit_key_rps=1.0, rate_limit_key_burst=3)
async def test_each_key_is_rate_limited(server: RunningServer, http: aiohttp.ClientSession) -> None:
    statuses = []
    for _ in range(5):
        async with http.get(f"{server.base_url}/api/v1/tasks", headers=server.auth) as resp:
            statuses.append(resp.status)
            if resp.status == 429:
                limited = await problem_of(resp, 429)
                assert limited["type"].endswith("/rate-limited")
                assert int(resp.headers["Retry-After"]) >= 1
    assert statuses == [200, 200, 200, 429, 429]
    other = (await new_member(server, Role.VIEWER, "v@x")).key
    async with http.get(f"{server.base_url}/api/v1/tasks", headers=bearer(other)) as resp:
        assert resp.status == 200  # another key has its own budget


@pytest.mark.with_settings(rate_limit_workspace_rps=1.0, rate_limit_workspace_burst=4)
async def test_each_workspace_is_rate_limited_across_its_keys(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    other = (await new_member(server, Role.VIEWER, "v@x")).key
    statuses = []
    for auth in [server.auth, bearer(other)] * 3:
        async with http.get(f"{server.base_url}/api/v1/tasks", headers=auth) as resp:
            statuses.append(resp.status)
    assert statuses == [200, 200, 200, 200, 429, 429]
