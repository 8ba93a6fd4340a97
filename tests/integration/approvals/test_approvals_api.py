"""Approvals through the API on both backends: a gated agent's task waits, is queued on approval
and cancelled on denial; who may decide; deciding twice; expiry by the default outcome; the
notices on the workspace stream; audit records; keyset pages."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID

import aiohttp

from bullpen.domain.principal import Role
from bullpen.store import audit
from tests.support.http import bearer, call, problem
from tests.support.seed import agent_key, new_member
from tests.support.servers import RunningServer
from tests.support.sse import read_events
from tests.support.team import (
    create_task,
    delegate,
    finish,
    get_task,
    make_agent,
    until_ended,
)


async def gated_agent(
    http: aiohttp.ClientSession, server: RunningServer, name: str = "gated", **extra: Any
) -> dict[str, Any]:
    agent = await make_agent(http, server, name, [{"text": "RAN"}])
    reply = await call(
        http,
        server,
        "PATCH",
        f"/api/v1/agents/{agent['id']}",
        body={"requires_approval": True, **extra},
    )
    assert reply.status == 200, reply.text
    assert reply.body["requires_approval"] is True
    return dict(reply.body)


async def pending_of(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str
) -> dict[str, Any]:
    reply = await call(http, server, "GET", "/api/v1/approvals?status=pending&limit=100")
    assert reply.status == 200, reply.text
    found = [a for a in reply.body["items"] if a["task_id"] == task_id]
    assert len(found) == 1, reply.body
    return dict(found[0])


async def test_a_gated_task_waits_then_runs_once_approved_and_twice_is_409(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await gated_agent(http, server)
    task = await create_task(http, server, agent, "Analyze this dataset")
    assert task["status"] == "awaiting_approval" and task["run"] is None
    approval = await pending_of(http, server, task["id"])
    assert approval["kind"] == "task" and approval["status"] == "pending"
    assert approval["approved"] is None and approval["default_outcome"] == "deny"
    await asyncio.sleep(0.3)  # nothing runs it meanwhile
    assert (await get_task(http, server, task["id"]))["status"] == "awaiting_approval"

    decided = await call(
        http, server, "POST", f"/api/v1/approvals/{approval['id']}/approve", body={}
    )
    assert decided.status == 200, decided.text
    assert decided.body["status"] == "approved" and decided.body["approved"] is True
    assert decided.body["decided_by"] is not None
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done" and ended["result"] == "RAN"

    again = await call(
        http, server, "POST", f"/api/v1/approvals/{approval['id']}/deny", body={"reason": "x"}
    )
    assert problem(again, 409)["type"].endswith("/approval-decided")
    svc = server.services
    async with svc.store.read() as conn:
        page = await audit.list_events(
            conn, server.boot.workspace_id, limit=10, after=None, action="approval.approve"
        )
    assert [e.target_id for e in page.rows] == [UUID(approval["id"])]


async def test_a_denied_task_is_cancelled_with_the_reason(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await gated_agent(http, server)
    task = await create_task(http, server, agent, "Analyze this dataset")
    approval = await pending_of(http, server, task["id"])
    reply = await call(
        http,
        server,
        "POST",
        f"/api/v1/approvals/{approval['id']}/deny",
        body={"reason": "not this quarter"},
    )
    assert reply.status == 200 and reply.body["approved"] is False
    ended = await get_task(http, server, task["id"])
    assert ended["status"] == "cancelled" and "not this quarter" in ended["error"]
    shown = await call(http, server, "GET", f"/api/v1/approvals/{approval['id']}")
    assert shown.body["status"] == "denied" and shown.body["reason"] == "not this quarter"
    assert (await call(http, server, "GET", "/api/v1/approvals?status=nope")).status == 422


async def test_who_may_decide(server: RunningServer, http: aiohttp.ClientSession) -> None:
    agent = await gated_agent(http, server)
    task = await create_task(http, server, agent, "Analyze this dataset")
    approval = await pending_of(http, server, task["id"])
    path = f"/api/v1/approvals/{approval['id']}/approve"
    member = await new_member(server, Role.MEMBER, "m@x.io")
    viewer = await new_member(server, Role.VIEWER, "v@x.io")
    for key in (member.key, viewer.key, await agent_key(server)):
        problem(await call(http, server, "POST", path, bearer(key), {}), 403)
    # Anyone who may read tasks sees it.
    assert (
        await call(http, server, "GET", path.rsplit("/", 1)[0], bearer(viewer.key))
    ).status == 200
    # An admin marks the member an approver (audited); then the member decides.
    marked = await call(
        http, server, "PATCH", f"/api/v1/members/{member.user_id}", body={"approver": True}
    )
    assert marked.status == 200 and marked.body["approver"] is True
    assert marked.body["role"] == "member"
    problem(
        await call(
            http,
            server,
            "PATCH",
            f"/api/v1/members/{viewer.user_id}",
            bearer(member.key),
            {"approver": True},
        ),
        403,
    )
    decided = await call(http, server, "POST", path, bearer(member.key), {"reason": "ok"})
    assert decided.status == 200, decided.text
    assert decided.body["decided_by"] == str(member.key_id)


async def test_an_undecided_approval_expires_with_its_default_outcome(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    denied_by_default = await gated_agent(http, server, "deny-default", approval_ttl_s=60)
    approved_by_default = await gated_agent(
        http, server, "approve-default", approval_ttl_s=60, approval_default="approve"
    )
    by_setting = await gated_agent(http, server, "setting-ttl")
    first = await create_task(http, server, denied_by_default, "Analyze this dataset")
    second = await create_task(http, server, approved_by_default, "Analyze this dataset")
    third = await create_task(http, server, by_setting, "Analyze this dataset")
    approvals = server.services.approvals
    assert await approvals.expire() == 0  # not yet
    clock = server.services.clock
    later = clock() + timedelta(seconds=61)
    approvals._clock = lambda: later  # type: ignore[method-assign]
    assert await approvals.expire() == 2  # the setting's day has not passed
    assert (await until_ended(http, server, first["id"]))["status"] == "cancelled"
    assert (await until_ended(http, server, second["id"]))["result"] == "RAN"
    assert (await get_task(http, server, third["id"]))["status"] == "awaiting_approval"
    listed = await call(http, server, "GET", "/api/v1/approvals?status=expired")
    assert {a["task_id"]: a["approved"] for a in listed.body["items"]} == {
        first["id"]: False,
        second["id"]: True,
    }
    much_later = clock() + timedelta(seconds=server.settings.approval_ttl_s + 1)
    approvals._clock = lambda: much_later  # type: ignore[method-assign]
    assert await approvals.expire() == 1
    assert (await get_task(http, server, third["id"]))["status"] == "cancelled"


async def test_approvals_are_notices_on_the_workspace_stream_and_lists_page(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await gated_agent(http, server)
    first = await create_task(http, server, agent, "Analyze this dataset")
    second = await create_task(http, server, agent, "Analyze this dataset")
    approval = await pending_of(http, server, first["id"])
    await call(http, server, "POST", f"/api/v1/approvals/{approval['id']}/deny", body={})
    url = f"{server.base_url}/api/v1/events?after=0"

    def seen(events: list[Any]) -> bool:
        return any(e.event == "approval.decided" for e in events)

    async with asyncio.timeout(10):
        events = await read_events(http, url, server.auth, until=seen)
    kinds = [e.event for e in events if e.event != "task" or e.data["task_id"] == first["id"]]
    assert kinds[:2] == ["task", "approval.requested"]
    decided = next(e for e in events if e.event == "approval.decided")
    assert decided.data["kind"] == "approval.decided" and decided.data["at"]
    assert decided.data["approval_id"] == approval["id"] and decided.data["approved"] is False
    # Resuming after the first notice gives the rest, notices included.
    requested = next(e for e in events if e.event == "approval.requested")
    async with asyncio.timeout(10):
        rest = await read_events(
            http, url, {**server.auth, "Last-Event-ID": str(requested.id)}, until=seen
        )
    assert [e.id for e in rest] == [e.id for e in events[events.index(requested) + 1 :]]

    page = await call(http, server, "GET", "/api/v1/approvals?limit=1")
    assert page.body["items"][0]["task_id"] == second["id"] and page.body["next_cursor"]
    cursor = page.body["next_cursor"]
    rest_page = await call(http, server, "GET", f"/api/v1/approvals?limit=1&cursor={cursor}")
    assert rest_page.body["items"][0]["task_id"] == first["id"]


async def test_a_denied_subtask_wakes_the_parent_that_waits_for_it(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    lead = await make_agent(
        http,
        server,
        "lead",
        [
            {"tool_calls": [delegate("gated", "Dig into part A")]},
            {"tool_calls": [finish("LEAD SAW: {{context}}")]},
        ],
    )
    report = await make_agent(http, server, "gated", [{"text": "NEVER"}], reports_to=lead["id"])
    reply = await call(
        http, server, "PATCH", f"/api/v1/agents/{report['id']}", body={"requires_approval": True}
    )
    assert reply.status == 200, reply.text
    task = await create_task(http, server, lead, "Lead the analysis")
    async with asyncio.timeout(15):
        while True:
            pending = await call(http, server, "GET", "/api/v1/approvals?status=pending")
            if pending.body["items"]:
                break
            await asyncio.sleep(0.05)
    (approval,) = pending.body["items"]
    async with asyncio.timeout(15):  # the lead's run ends, waiting for its subtask
        while (await get_task(http, server, task["id"]))["status"] != "blocked":
            await asyncio.sleep(0.05)
    denied = await call(
        http, server, "POST", f"/api/v1/approvals/{approval['id']}/deny", body={"reason": "no"}
    )
    assert denied.status == 200, denied.text
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done" and "cancelled" in ended["result"], ended
