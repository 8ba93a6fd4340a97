"""Deep and wide subtask trees over a real socket, on both backends: the depth cap, and a cancel
that reaches every descendant (issue 19, finding 6).

A chain deeper than the cap cannot be made through the API any more, but one made before the cap
existed can still be cancelled: the trees here are written through the store's own functions
(fast), in the states a real tree is in (blocked parents, queued and running runs).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store import tasks as task_store
from bullpen.store import workflow
from bullpen.store.tables import audit_events, runs, tasks
from tests.support.db import count, rows
from tests.support.http import call, problem
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"
# Runs stay running (no first token for 20 s) until they are cancelled.
HANGING = {"sim_ttft_ms": 20_000.0}
OPEN = [s.value for s in TaskStatus if s.value not in ("done", "failed", "cancelled")]


async def add_tree(
    server: RunningServer, parents: list[uuid.UUID | None], *, queued_every: int = 0
) -> list[uuid.UUID]:
    """Tasks with the given parents (None: a root; an int: an index into the tasks made here),
    as the API leaves them: every `queued_every`-th queued with its run, the rest blocked."""
    svc = server.services
    made: list[uuid.UUID] = []
    async with svc.store.write() as conn:
        for index, parent in enumerate(parents):
            parent_id = made[parent] if isinstance(parent, int) else parent
            fields: dict[str, Any] = {
                "workspace_id": server.boot.workspace_id,
                "agent_id": server.boot.agent_id,
                "title": f"t{index}",
                "prompt": PROMPT,
                "now": svc.clock(),
                "parent_id": parent_id,
            }
            if queued_every and index % queued_every == 0:
                task, _run = await task_store.insert_task_with_run(conn, **fields)
            else:
                task = await task_store.insert_blocked_task(conn, **fields)
            if parent_id is not None:
                await workflow.count_child(conn, parent_id)
            made.append(task.id)
    if queued_every:
        svc.tasks._on_enqueued()
    return made


def chain(length: int) -> list[Any]:
    """Parents of a chain: a root, then each task the child of the one before."""
    return [None, *range(length - 1)]


async def open_left(server: RunningServer) -> tuple[int, int]:
    """(tasks that have not ended, runs queued or running) in the whole database."""
    return (
        await count(server, tasks, tasks.c.status.in_(OPEN)),
        await count(
            server,
            runs,
            runs.c.status.in_([RunStatus.QUEUED.value, RunStatus.RUNNING.value]),
        ),
    )


async def until_all_ended(server: RunningServer) -> tuple[int, int]:
    """Wait (generously) until nothing is open or runnable; returns what is left."""
    deadline = time.monotonic() + 30
    while True:
        left = await open_left(server)
        if left == (0, 0) or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.1)


async def left_open(server: RunningServer) -> list[dict[str, Any]]:
    """The tasks that have not ended with their runs' states: what a failure shows."""
    query = (
        sa.select(
            tasks.c.title,
            tasks.c.status,
            runs.c.status.label("run"),
            runs.c.attempt,
            runs.c.cancel_requested_at,
            runs.c.started_at,
        )
        .select_from(tasks.outerjoin(runs, runs.c.task_id == tasks.c.id))
        .where(tasks.c.status.in_(OPEN))
    )
    return [dict(row._mapping) for row in await rows(server, query)]


async def cancel(http: aiohttp.ClientSession, server: RunningServer, task_id: uuid.UUID) -> Any:
    reply = await call(http, server, "POST", f"/api/v1/tasks/{task_id}/cancel")
    assert reply.status == 200, reply.text
    assert reply.body["status"] == "cancelled"
    return reply.body


@pytest.mark.with_settings(**HANGING)
async def test_cancelling_a_chain_of_a_thousand_cancels_every_level(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    made = await add_tree(server, chain(1000), queued_every=97)
    await cancel(http, server, made[0])
    assert await until_all_ended(server) == (0, 0), await left_open(server)
    assert await count(server, tasks, tasks.c.status == "cancelled") == 1000
    # Each cancelled task is audited, the root by the request, the rest as part of it.
    assert await count(server, audit_events, audit_events.c.action == "task.cancel") == 1000


@pytest.mark.with_settings(**HANGING)
async def test_a_wide_tree_is_cancelled_in_batches_and_blocked_tasks_elsewhere_wake(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # A root with 700 children, each of the first 300 with a child of its own: 1,001 tasks.
    parents: list[Any] = [None, *[0] * 700, *range(1, 301)]
    made = await add_tree(server, parents, queued_every=50)
    # A task outside the tree waits for one inside it; it is woken when that one is cancelled.
    outside = await call(
        http,
        server,
        "POST",
        "/api/v1/tasks",
        body={
            "prompt": PROMPT,
            "agent_id": str(server.boot.agent_id),
            "blocked_by": [str(made[900])],
        },
    )
    assert outside.status == 201 and outside.body["status"] == "blocked", outside.text
    await cancel(http, server, made[0])
    deadline = time.monotonic() + 30
    while await count(server, tasks, tasks.c.status.in_(OPEN), tasks.c.id.in_(made)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert await count(server, tasks, tasks.c.status == "cancelled") == len(made)
    woken = (await call(http, server, "GET", f"/api/v1/tasks/{outside.body['id']}")).body
    assert woken["status"] != "blocked" and woken["run"] is not None


async def test_cancel_again_finishes_a_cancel_that_was_cut_short(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # What an interrupted cancel leaves: the root cancelled, levels below it still open.
    made = await add_tree(server, chain(300), queued_every=0)
    svc = server.services
    async with svc.store.write() as conn:
        assert await task_store.set_task_status(conn, made[0], TaskStatus.CANCELLED, svc.clock())
    assert await open_left(server) == (299, 0)
    await cancel(http, server, made[0])
    assert await open_left(server) == (0, 0)


@pytest.mark.with_settings(**HANGING)  # no parent ends (and refuses subtasks) meanwhile
async def test_a_subtask_deeper_than_the_cap_is_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    cap = server.settings.task_max_depth
    body: dict[str, Any] = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    made: list[str] = []
    for _ in range(cap + 1):  # the root, then `cap` levels of subtasks
        parent = {"parent_id": made[-1]} if made else {}
        reply = await call(http, server, "POST", "/api/v1/tasks", body={**body, **parent})
        assert reply.status == 201, reply.text
        made.append(reply.body["id"])
    deeper = await call(http, server, "POST", "/api/v1/tasks", body={**body, "parent_id": made[-1]})
    refused = problem(deeper, 422)
    assert refused["type"] == "https://bullpen.dev/problems/task-too-deep"
    assert [e["field"] for e in refused["errors"]] == ["parent_id"]
    assert str(cap) in refused["detail"]
    assert await count(server, tasks) == cap + 1
    # A sibling at the cap's depth is fine; cancelling the root ends the whole tree.
    sibling = await call(
        http, server, "POST", "/api/v1/tasks", body={**body, "parent_id": made[-2]}
    )
    assert sibling.status == 201, sibling.text
    await cancel(http, server, uuid.UUID(made[0]))
    assert await until_all_ended(server) == (0, 0), await left_open(server)


@pytest.mark.with_settings(task_max_depth=2, **HANGING)
async def test_the_depth_cap_is_a_setting(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body: dict[str, Any] = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    root = (await call(http, server, "POST", "/api/v1/tasks", body=body)).body["id"]
    child = (
        await call(http, server, "POST", "/api/v1/tasks", body={**body, "parent_id": root})
    ).body
    grandchild = await call(
        http, server, "POST", "/api/v1/tasks", body={**body, "parent_id": child["id"]}
    )
    assert grandchild.status == 201, grandchild.text
    deeper = await call(
        http, server, "POST", "/api/v1/tasks", body={**body, "parent_id": grandchild.body["id"]}
    )
    assert problem(deeper, 422)["type"].endswith("/task-too-deep")
    assert await count(server, tasks) == 3
