"""SQLite's group commit: writers in one turn of the event loop share one COMMIT (issue 21).

Each writer runs in a savepoint of the group's transaction, so one that fails undoes only its
own statements; each returns only once the group has committed, so nothing is acknowledged
before it is on disk; a COMMIT that fails fails every writer in the group.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.store import base
from bullpen.store.base import Connection, Store

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

_SCRATCH = sa.table("scratch", sa.column("id"), sa.column("parent"))


@pytest.fixture
async def scratch(store: Store) -> Store:
    def create(conn: sa.Connection) -> None:
        conn.exec_driver_sql(
            "CREATE TABLE scratch (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES scratch(id))"
        )

    await store.run_sync(create)
    return store


async def insert(conn: Connection, row_id: int, parent: int | None = None) -> None:
    await conn.execute(sa.insert(_SCRATCH).values(id=row_id, parent=parent))


async def stored(store: Store) -> set[int]:
    """The rows another connection sees: what has been committed."""
    async with store.read() as conn:
        return {int(r.id) for r in await conn.execute(sa.select(_SCRATCH.c.id))}


async def write_row(store: Store, row_id: int) -> None:
    async with store.write() as conn:
        await insert(conn, row_id)


async def test_writers_in_one_turn_share_one_commit(scratch: Store) -> None:
    commits, kept = scratch.group_commits, scratch.group_members
    await asyncio.gather(*(write_row(scratch, i) for i in range(1, 6)))
    assert scratch.group_commits - commits == 1
    assert scratch.group_members - kept == 5
    assert await stored(scratch) == {1, 2, 3, 4, 5}


async def test_a_full_group_commits_and_the_next_one_starts(scratch: Store) -> None:
    commits = scratch.group_commits
    count = 2 * base._GROUP_MAX + 2
    await asyncio.gather(*(write_row(scratch, i) for i in range(1, count + 1)))
    assert scratch.group_commits - commits == 3  # full, full, and the last two
    assert await stored(scratch) == set(range(1, count + 1))


async def test_a_failing_writer_undoes_only_its_own_statements(scratch: Store) -> None:
    async def failing() -> None:
        async with scratch.write() as conn:
            await insert(conn, 2)
            raise ValueError("the writer's own failure")

    commits = scratch.group_commits
    results = await asyncio.gather(
        write_row(scratch, 1), failing(), write_row(scratch, 3), return_exceptions=True
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], ValueError)
    assert scratch.group_commits - commits == 1
    assert await stored(scratch) == {1, 3}


async def test_a_failed_commit_fails_every_writer_in_the_group(scratch: Store) -> None:
    async def dangling() -> None:
        async with scratch.write() as conn:
            # A deferred foreign key is checked at COMMIT: the group's commit fails.
            await conn.execute(sa.text("PRAGMA defer_foreign_keys = ON"))
            await insert(conn, 1, parent=999)

    results = await asyncio.gather(dangling(), write_row(scratch, 2), return_exceptions=True)
    assert all(isinstance(r, exc.IntegrityError) for r in results), results
    assert await stored(scratch) == set()
    await write_row(scratch, 3)  # the next group starts afresh
    assert await stored(scratch) == {3}


async def test_a_writer_returns_only_after_its_group_has_committed(scratch: Store) -> None:
    seen_by_callback: list[set[int]] = []
    engine = scratch.engine
    assert isinstance(engine, sa.Engine)

    def committed_now() -> None:  # on another connection, synchronously
        with engine.connect() as conn:
            seen_by_callback.append({int(r.id) for r in conn.execute(sa.select(_SCRATCH.c.id))})

    async def with_callback() -> set[int]:
        async with scratch.write() as conn:
            await insert(conn, 1)
            scratch.after_commit(committed_now)
        return await stored(scratch)

    seen_after, _ = await asyncio.gather(with_callback(), write_row(scratch, 2))
    assert seen_after == {1, 2}
    assert seen_by_callback == [{1, 2}]


async def test_a_writer_cancelled_while_waiting_does_not_stop_the_commit(scratch: Store) -> None:
    first = asyncio.create_task(write_row(scratch, 1))
    second = asyncio.create_task(write_row(scratch, 2))
    await asyncio.sleep(0)  # both bodies have run; the group commits on the next turn
    assert not first.done() and not second.done()
    first.cancel()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    # The cancelled writer's statements were already in the group: they are committed.
    assert await stored(scratch) == {1, 2}


async def test_a_writer_that_waits_inside_its_transaction_holds_the_commit(
    scratch: Store,
) -> None:
    release = asyncio.Event()

    async def slow() -> None:
        async with scratch.write() as conn:
            await insert(conn, 1)
            await release.wait()  # not a statement: the group may not commit meanwhile
            await insert(conn, 2)

    slow_task = asyncio.create_task(slow())
    fast_task = asyncio.create_task(write_row(scratch, 3))
    for _ in range(5):
        await asyncio.sleep(0)
    assert await stored(scratch) == set()  # nothing half-done is visible
    release.set()
    await asyncio.gather(slow_task, fast_task)
    assert await stored(scratch) == {1, 2, 3}
