"""Workspace notices on both backends: written in the caller's transaction (a rollback leaves
nothing), read in one order with task changes, resumable from a notice's position, framed as
`event: <kind>`, and deleted with expired changes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import orjson
import pytest

from bullpen.services.housekeeping import Retention, sweep
from bullpen.store import changes
from bullpen.store.base import Store
from bullpen.store.changes import Notice, TaskChange
from bullpen.store.notices import add_notice
from bullpen.store.tables import tasks
from bullpen.streams.changes import format_change
from tests.support.seed import NOW, new_task, workspace_with_agent


async def log(store: Store, ws: uuid.UUID) -> list[changes.Change]:
    async with store.read() as conn:
        page, held = await changes.after(conn, ws, changes.START, 1000)
    assert not held
    return page


def label(change: changes.Change) -> str:
    if isinstance(change, Notice):
        return change.kind
    return f"task:{change.status}"


async def test_notices_and_task_changes_share_one_order_and_resume(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    other, _ = await workspace_with_agent(store, "w2")
    task_id, _ = await new_task(store, ws, agent)
    async with store.write() as conn:
        await add_notice(conn, ws, "approval.requested", {"approval_id": "a1"}, NOW)
        await conn.execute(tasks.update().where(tasks.c.id == task_id).values(status="running"))
        await add_notice(conn, other, "budget.warning", {"budget_id": "b"}, NOW)
    async with store.write() as conn:
        await add_notice(conn, ws, "approval.decided", {"approval_id": "a1"}, NOW)
    page = await log(store, ws)
    assert [label(c) for c in page] == [
        "task:queued",
        "approval.requested",
        "task:running",
        "approval.decided",
    ]
    assert [label(c) for c in await log(store, other)] == ["budget.warning"]
    async with store.read() as conn:
        assert await changes.head(conn, ws) == page[-1].cursor
        for k, change in enumerate(page):  # resuming after any of them gives exactly the rest
            rest, _ = await changes.after(conn, ws, change.cursor, 2)
            assert rest == page[k + 1 : k + 3]
        # A task's own positions skip notices.
        assert await changes.last_of(conn, task_id) == page[2].cursor
    notice = page[1]
    assert isinstance(notice, Notice)
    assert notice.data() == {
        "approval_id": "a1",
        "kind": "approval.requested",
        "at": NOW.isoformat(),
    }
    frame = format_change(notice)
    head, _, body = frame.partition(b"\ndata: ")
    assert head.split(b"\n")[1] == b"event: approval.requested"
    assert orjson.loads(body) == notice.data()
    task_frame = format_change(page[0])
    assert isinstance(page[0], TaskChange) and b"\nevent: task\n" in task_frame


async def test_a_notice_in_a_rolled_back_transaction_never_appears(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with store.write() as conn:
            await add_notice(conn, ws, "approval.requested", {"approval_id": "x"}, NOW)
            raise Abort
    await new_task(store, ws, agent)
    assert [label(c) for c in await log(store, ws)] == ["task:queued"]


async def test_a_bad_kind_is_refused(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    async with store.write() as conn:
        for kind in ("", "task", "x" * 41):
            with pytest.raises(ValueError):
                await add_notice(conn, ws, kind, {}, NOW)


async def test_expired_notices_are_pruned_with_changes(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent, NOW - timedelta(days=40))
    async with store.write() as conn:
        await add_notice(conn, ws, "agent.paused", {}, NOW - timedelta(days=40))
        await add_notice(conn, ws, "agent.paused", {"kept": True}, NOW - timedelta(days=1))
    deleted = await sweep(store, NOW, Retention(events=timedelta(days=30), event_batch=100))
    assert deleted["task_changes"] == 2
    page = await log(store, ws)
    assert [c.data() for c in page] == [
        {"kept": True, "kind": "agent.paused", "at": (NOW - timedelta(days=1)).isoformat()}
    ]


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_reader_never_passes_a_notice_that_commits_later(store: Store) -> None:
    """A notice written first but committed last holds back a task change committed before it:
    the reader never moves past the notice's position before it can see it."""
    ws, agent = await workspace_with_agent(store)
    task_id, _ = await new_task(store, ws, agent)
    async with store.read() as conn:
        start = await changes.head(conn, ws)
    written, release = asyncio.Event(), asyncio.Event()

    async def notice() -> None:
        async with store.write() as conn:
            await add_notice(conn, ws, "approval.requested", {}, NOW)
            written.set()
            await release.wait()

    writer = asyncio.create_task(notice())
    await written.wait()
    async with store.write() as conn:
        await conn.execute(tasks.update().where(tasks.c.id == task_id).values(status="running"))
    async with store.read() as conn:
        assert await changes.after(conn, ws, start, 10) == ([], True)
    release.set()
    await writer
    async with store.read() as conn:
        page, held = await changes.after(conn, ws, start, 10)
    assert [label(c) for c in page] == ["approval.requested", "task:running"] and not held
