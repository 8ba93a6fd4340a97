"""Acceptance (issue 22, approvals): a gated agent's task waits in `awaiting_approval` through a
server restart and runs once approved; a tool call held for an approval resumes after its step
without asking the model again for the steps it completed (the simulator counts requests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import aiohttp
import sqlalchemy as sa

from bullpen.app import open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings
from bullpen.store.tables import task_comments, task_steps
from tests.support.db import rows
from tests.support.http import call
from tests.support.servers import RunningServer, start_server
from tests.support.team import create_task, get_task, make_agent, runs_of, until_ended


@asynccontextmanager
async def serving(
    settings: Settings, before: RunningServer | None = None
) -> AsyncIterator[RunningServer]:
    """A server (API + worker) on `settings`' database, stopped on exit; after `before` (the
    same database served before), with its bootstrap admin's key."""
    if before is not None:
        boot = before.boot
    else:
        async with open_store(settings) as st:
            boot = await ensure_bootstrap(
                st, load_secret(settings.secret_key, settings.data_dir), utcnow
            )
    srv, task, base_url = await start_server(settings)
    try:
        yield RunningServer(base_url, srv.config.app.state.services, boot, settings)
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 15)


async def approval_of(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str
) -> dict[str, Any]:
    reply = await call(http, server, "GET", "/api/v1/approvals?status=pending")
    found = [a for a in reply.body["items"] if a["task_id"] == task_id]
    assert len(found) == 1, reply.body
    return dict(found[0])


async def until_status(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str, status: str
) -> dict[str, Any]:
    async with asyncio.timeout(15):
        while True:
            task = await get_task(http, server, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


async def test_a_gated_task_waits_through_a_restart_and_runs_once_approved(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with serving(settings) as server:
        agent = await make_agent(http, server, "gated", [{"text": "APPROVED RUN"}])
        patched = await call(
            http, server, "PATCH", f"/api/v1/agents/{agent['id']}", body={"requires_approval": True}
        )
        assert patched.status == 200, patched.text
        approved = await create_task(http, server, agent, "Analyze this dataset")
        denied = await create_task(http, server, agent, "Analyze that dataset")
        assert approved["status"] == denied["status"] == "awaiting_approval"
    async with serving(settings, server) as server:  # a new process, the same database
        await asyncio.sleep(0.3)
        assert (await get_task(http, server, approved["id"]))["status"] == "awaiting_approval"
        assert await runs_of(server, approved["id"]) == []
        first = await approval_of(http, server, approved["id"])
        second = await approval_of(http, server, denied["id"])
        ok = await call(http, server, "POST", f"/api/v1/approvals/{first['id']}/approve", body={})
        assert ok.status == 200, ok.text
        no = await call(
            http,
            server,
            "POST",
            f"/api/v1/approvals/{second['id']}/deny",
            body={"reason": "out of scope"},
        )
        assert no.status == 200, no.text
        done = await until_ended(http, server, approved["id"])
        assert done["status"] == "done" and done["result"] == "APPROVED RUN"
        cancelled = await get_task(http, server, denied["id"])
        assert cancelled["status"] == "cancelled" and "out of scope" in cancelled["error"]
        assert await runs_of(server, denied["id"]) == []


def comment(body: str) -> dict[str, Any]:
    return {"name": "comment", "arguments": {"body": body}}


async def test_a_held_tool_call_resumes_after_its_step_without_asking_the_model_again(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    turns = [
        {"tool_calls": [comment("first note")]},  # step 1: not gated, carried out
        {"tool_calls": [comment("second note"), {"name": "finish", "arguments": {"result": "x"}}]},
        {"text": "NEVER"},
    ]
    # Step 2 calls `comment` (gated) and `finish`: held; approved, it finishes the task.
    async with serving(settings) as server:
        simulator = server.services.simulator
        assert simulator is not None
        agent = await make_agent(http, server, "careful", turns, approval_tools=["comment"])
        # Step 1's comment is gated too: it waits first, and the run resumes after it.
        task = await create_task(http, server, agent, "Write two notes")
        await until_status(http, server, task["id"], "awaiting_approval")
        assert simulator.requests["sim-1"] == 1
        held = await approval_of(http, server, task["id"])
        assert held["kind"] == "tool_call" and held["step"] == 1 and held["tools"] == ["comment"]
        assert [c["name"] for c in held["calls"]] == ["comment"]
    async with serving(settings, server) as server:  # the held step survives a restart
        simulator = server.services.simulator
        assert simulator is not None
        ok = await call(http, server, "POST", f"/api/v1/approvals/{held['id']}/approve", body={})
        assert ok.status == 200, ok.text
        await until_status(http, server, task["id"], "awaiting_approval")
        # The resumed run asked the model once, for step 2 only (step 1 was not asked again).
        assert simulator.requests["sim-1"] == 1
        second = await approval_of(http, server, task["id"])
        assert second["step"] == 2
        no = await call(
            http,
            server,
            "POST",
            f"/api/v1/approvals/{second['id']}/deny",
            body={"reason": "one note is enough"},
        )
        assert no.status == 200, no.text
        ended = await until_ended(http, server, task["id"])
        # Denied: the comment was not made; `finish` in the same step ran, with no new request.
        assert ended["status"] == "done" and ended["result"] == "x"
        assert simulator.requests["sim-1"] == 1
        notes = await rows(
            server,
            sa.select(task_comments.c.body).where(task_comments.c.task_id == UUID(task["id"])),
        )
        assert [n.body for n in notes] == ["first note"]
        steps = await rows(
            server,
            sa.select(task_steps.c.step, task_steps.c.messages)
            .where(task_steps.c.task_id == UUID(task["id"]))
            .order_by(task_steps.c.step),
        )
        assert [s.step for s in steps] == [1, 2]
        results = [m["content"] for m in steps[1].messages if m["role"] == "tool"]
        assert "denied" in results[0] and "one note is enough" in results[0]
        assert results[1] == "finished"
        assert len(await runs_of(server, task["id"])) == 3


async def test_a_denied_tool_call_tells_the_model_and_the_loop_goes_on(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    turns = [{"tool_calls": [comment("a note")]}, {"text": "GOT: {{context}}"}]
    async with serving(settings) as server:
        simulator = server.services.simulator
        assert simulator is not None
        agent = await make_agent(http, server, "denied", turns, approval_tools=["comment"])
        task = await create_task(http, server, agent, "Write a note")
        await until_status(http, server, task["id"], "awaiting_approval")
        held = await approval_of(http, server, task["id"])
        no = await call(
            http, server, "POST", f"/api/v1/approvals/{held['id']}/deny", body={"reason": "no"}
        )
        assert no.status == 200
        ended = await until_ended(http, server, task["id"])
        assert ended["status"] == "done" and ended["result"].startswith("GOT:")
        assert simulator.requests["sim-1"] == 2  # the held step was not asked for again
        notes = await rows(
            server,
            sa.select(task_comments.c.body).where(task_comments.c.task_id == UUID(task["id"])),
        )
        assert notes == []
