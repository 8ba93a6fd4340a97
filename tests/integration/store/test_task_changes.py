"""The task change log on both backends: the triggers record every creation and status change
in the changing transaction (and nothing else), readers get them in an order no late commit can
break, and expired changes are deleted in batches."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest
import sqlalchemy as sa

from bullpen.domain.status import TaskStatus
from bullpen.services.housekeeping import Retention, sweep
from bullpen.store import changes
from bullpen.store import tasks as task_store
from bullpen.store import workspaces as workspace_store
from bullpen.store.base import Store
from bullpen.store.tables import task_changes, tasks
from tests.support.postgres import PG_ADMIN_URL
from tests.support.seed import NOW, insert_task, new_task, workspace_with_agent


async def statuses(store: Store, ws: uuid.UUID) -> list[tuple[uuid.UUID, str | None, str]]:
    """(task, previous, status) of every change of the workspace, in the log's order."""
    async with store.read() as conn:
        page, held = await changes.after(conn, ws, changes.START, 1000)
    assert not held
    return [(c.task_id, c.previous, c.status) for c in page]


async def set_status(store: Store, task_id: uuid.UUID, status: TaskStatus) -> None:
    async with store.write() as conn:
        await conn.execute(
            tasks.update().where(tasks.c.id == task_id).values(status=status.value, updated_at=NOW)
        )


async def test_creations_and_status_changes_are_logged_and_nothing_else(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    first, _ = await new_task(store, ws, agent)
    second, _ = await new_task(store, ws, agent)
    await set_status(store, first, TaskStatus.RUNNING)
    async with store.write() as conn:  # not a status change: no row
        await task_store.update_task(conn, ws, first, {"priority": 3, "title": "renamed"}, NOW)
        await conn.execute(tasks.update().where(tasks.c.id == second).values(status="queued"))
    await set_status(store, first, TaskStatus.DONE)
    assert await statuses(store, ws) == [
        (first, None, "queued"),
        (second, None, "queued"),
        (first, "queued", "running"),
        (first, "running", "done"),
    ]
    async with store.read() as conn:
        page, _ = await changes.after(conn, ws, changes.START, 10)
        assert await changes.head(conn, ws) == page[-1].cursor
        assert await changes.head(conn, uuid.uuid4()) == changes.START
        # Resuming after any change gives exactly the rest, in pages.
        for k, change in enumerate(page):
            rest, _ = await changes.after(conn, ws, change.cursor, 2)
            assert rest == page[k + 1 : k + 3]
    assert page[0].data()["title"] == "t" and page[0].data()["previous"] is None
    assert page[2].data() == {
        "task_id": str(first),
        "number": "T-1",
        "parent_id": None,
        "agent_id": str(agent),
        "status": "running",
        "previous": "queued",
        "at": NOW.isoformat(),
    }


async def test_a_rolled_back_change_leaves_no_row(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    task_id, _ = await new_task(store, ws, agent)

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with store.write() as conn:
            await insert_task(conn, ws, agent)
            await conn.execute(tasks.update().where(tasks.c.id == task_id).values(status="running"))
            raise Abort
    assert await statuses(store, ws) == [(task_id, None, "queued")]


async def test_changes_of_another_workspace_are_not_read(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    other, their_agent = await workspace_with_agent(store, "w2")
    mine, _ = await new_task(store, ws, agent)
    await new_task(store, other, their_agent)
    assert await statuses(store, ws) == [(mine, None, "queued")]


async def test_subtree_and_first_change_of_a_tree(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    before, _ = await new_task(store, ws, agent)
    root, _ = await new_task(store, ws, agent)
    child, _ = await new_task(store, ws, agent)
    grandchild, _ = await new_task(store, ws, agent)
    async with store.write() as conn:
        await conn.execute(tasks.update().where(tasks.c.id == child).values(parent_id=root))
        await conn.execute(tasks.update().where(tasks.c.id == grandchild).values(parent_id=child))
    async with store.read() as conn:
        assert await changes.subtree(conn, root) == {root, child, grandchild}
        assert await changes.subtree(conn, grandchild) == {grandchild}
        start = await changes.first_of(conn, {root, child})
        assert start is not None
        page, _ = await changes.after(conn, ws, start, 10)
        assert await changes.first_of(conn, {uuid.uuid4()}) is None
    assert [c.task_id for c in page] == [root, child, grandchild]
    assert before not in {c.task_id for c in page}


async def test_expired_changes_are_deleted_in_batches(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    for _ in range(5):
        await new_task(store, ws, agent, NOW - timedelta(days=40))
    keep, _ = await new_task(store, ws, agent, NOW - timedelta(days=1))
    deleted = await sweep(store, NOW, Retention(events=timedelta(days=30), event_batch=100))
    assert deleted["task_changes"] == 5
    assert await statuses(store, ws) == [(keep, None, "queued")]
    async with store.write() as conn:
        for _ in range(3):
            await insert_task(conn, ws, agent, NOW - timedelta(days=40))
    async with store.write() as conn:
        assert await changes.delete_expired(conn, NOW - timedelta(days=30), 2) == 2
    async with store.write() as conn:
        assert await changes.delete_expired(conn, NOW - timedelta(days=30), 2) == 1
    async with store.read() as conn:
        count = (await conn.execute(sa.select(sa.func.count()).select_from(task_changes))).scalar()
    assert count == 1


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize("first_commits", ["earlier", "later"])
async def test_a_reader_never_passes_a_change_that_commits_later(
    store: Store, first_commits: str
) -> None:
    """Two transactions change tasks A then B (A's row gets the lower id and xid). Whichever
    commits first, a reader sees nothing while A's transaction runs, then A before B: it never
    moves past a change that is yet to commit."""
    ws, agent = await workspace_with_agent(store)
    a, _ = await new_task(store, ws, agent)
    b, _ = await new_task(store, ws, agent)
    async with store.read() as conn:
        start = await changes.head(conn, ws)

    a_written, b_written = asyncio.Event(), asyncio.Event()
    release_a, release_b = asyncio.Event(), asyncio.Event()

    async def change(task_id: uuid.UUID, written: asyncio.Event, release: asyncio.Event) -> None:
        async with store.write() as conn:
            await conn.execute(tasks.update().where(tasks.c.id == task_id).values(status="running"))
            written.set()
            await release.wait()

    writer_a = asyncio.create_task(change(a, a_written, release_a))
    await a_written.wait()
    writer_b = asyncio.create_task(change(b, b_written, release_b))
    await b_written.wait()
    order = (release_b, release_a) if first_commits == "later" else (release_a, release_b)
    order[0].set()
    await (writer_b if order[0] is release_b else writer_a)

    async with store.read() as conn:
        page, held = await changes.after(conn, ws, start, 10)
    if first_commits == "later":  # B committed, A still running: B waits behind A
        assert (page, held) == ([], True)
    else:  # A committed, B still running: A can be read
        assert [c.task_id for c in page] == [a] and not held
    order[1].set()
    await asyncio.gather(writer_a, writer_b)
    async with store.read() as conn:
        page, held = await changes.after(conn, ws, start, 10)
    assert [c.task_id for c in page] == [a, b] and not held


@pytest.mark.parametrize("backend", ["postgres"])
async def test_another_databases_open_transaction_does_not_hold_a_reader_back(
    store: Store,
) -> None:
    """PostgreSQL's snapshot lists every running transaction of the server. One left open in
    another database (its id older than the change) cannot write this log, so it holds nothing
    back; one left open in this database does, until it ends."""
    ws, agent = await workspace_with_agent(store)
    a, _ = await new_task(store, ws, agent)
    async with store.read() as conn:
        start = await changes.head(conn, ws)
    elsewhere = await asyncpg.connect(PG_ADMIN_URL)  # the server's admin database, not ours
    try:
        async with elsewhere.transaction():
            assert await elsewhere.fetchval("SELECT pg_current_xact_id()::text") is not None
            await set_status(store, a, TaskStatus.RUNNING)
            async with store.read() as conn:
                page, held = await changes.after(conn, ws, start, 10)
            assert [c.status for c in page] == ["running"] and not held

            async with store.write() as here:  # an open write transaction in this database
                await here.execute(sa.text("SELECT pg_current_xact_id()"))
                await set_status(store, a, TaskStatus.DONE)
                async with store.read() as conn:
                    page, held = await changes.after(conn, ws, page[-1].cursor, 10)
                assert (page, held) == ([], True)
    finally:
        await elsewhere.close()


async def test_deleting_a_workspace_deletes_its_changes(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    other, their_agent = await workspace_with_agent(store, "w2")
    await new_task(store, ws, agent)
    theirs, _ = await new_task(store, other, their_agent)
    async with store.write() as conn:
        counts = await workspace_store.delete_workspace(conn, ws)
    assert counts["task_changes"] == 1
    assert await statuses(store, ws) == []
    assert await statuses(store, other) == [(theirs, None, "queued")]
