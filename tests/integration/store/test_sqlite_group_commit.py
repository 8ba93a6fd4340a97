"""SQLite's group commit (`bullpen.store.base.GroupCommit`): writers that queue behind each
other share one transaction and one commit, each in a savepoint of its own; none returns
before the commit that makes its work durable, and when the group's transaction is lost or its
commit fails, every writer in it gets the error."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from bullpen.errors import BullpenError
from bullpen.store import identity
from bullpen.store.base import WRITE_OPTION, Connection, GroupCommit, Store
from bullpen.store.tables import agents, workspaces
from tests.support.seed import NOW

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

Body = Callable[[Connection, str], Awaitable[None]]


@pytest.fixture(autouse=True)
def _patient_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups close by size and by who waits, not by the clock (a slow machine would split
    them at MAX_AGE_S)."""
    monkeypatch.setattr(GroupCommit, "MAX_AGE_S", 60.0)


class Boom(Exception):
    """A writer's own failure."""


def _commits(store: Store) -> list[int]:
    """The write transactions' commits, from now on (reads commit too, and are not counted)."""
    counted: list[int] = []

    def commit(conn: sa.Connection) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            counted.append(1)

    sa.event.listen(store.engine, "commit", commit)
    return counted


async def _slugs(store: Store) -> set[str]:
    async with store.read() as conn:
        return set((await conn.execute(sa.select(workspaces.c.slug))).scalars())


async def _workspace(conn: Connection, slug: str) -> None:
    await identity.create_workspace(conn, name=slug, slug=slug, task_key="T", now=NOW)


async def _writers(store: Store, bodies: list[Body]) -> list[Any]:
    """Run one writer per body, all queued behind the first (which waits inside its turn
    until the rest are waiting); each checks from another connection, the moment its write
    returns, that its workspace is there. Returns each writer's result or exception."""

    async def write(i: int, body: Body) -> None:
        slug = f"w{i}"
        async with store.write() as conn:
            if i == 0:
                await asyncio.sleep(0.02)  # the others queue meanwhile
            await body(conn, slug)
        assert slug in await _slugs(store), f"{slug} returned before its commit"

    return await asyncio.gather(
        *(write(i, body) for i, body in enumerate(bodies)), return_exceptions=True
    )


async def test_writers_waiting_in_turn_share_one_commit_and_return_once_it_is_done(
    store: Store,
) -> None:
    commits = _commits(store)
    results = await _writers(store, [_workspace] * 12)
    assert results == [None] * 12
    assert await _slugs(store) == {f"w{i}" for i in range(12)}
    assert len(commits) == 1


async def test_a_group_commits_once_it_has_max_members(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GroupCommit, "MAX_MEMBERS", 4)
    commits = _commits(store)
    assert await _writers(store, [_workspace] * 12) == [None] * 12
    assert len(commits) == 3


async def test_a_lone_writer_commits_at_once(store: Store) -> None:
    commits = _commits(store)
    for i in range(3):
        async with store.write() as conn:
            await _workspace(conn, f"solo{i}")
        assert len(commits) == i + 1


async def test_a_failing_writer_is_rolled_back_alone(store: Store) -> None:
    async def fails(conn: Connection, slug: str) -> None:
        await _workspace(conn, slug)
        raise Boom(slug)

    async def duplicate(conn: Connection, slug: str) -> None:
        await _workspace(conn, slug)
        await _workspace(conn, slug)  # the slug is unique: an IntegrityError

    results = await _writers(store, [_workspace, fails, _workspace, duplicate, _workspace])
    assert isinstance(results[1], Boom)
    assert isinstance(results[3], sa.exc.IntegrityError)
    assert [r is None for r in results] == [True, False, True, False, True]
    assert await _slugs(store) == {"w0", "w2", "w4"}


async def test_when_the_transaction_is_lost_every_writer_in_it_fails(store: Store) -> None:
    """A trigger's RAISE(ROLLBACK) ends the whole transaction, as SQLite does on its own for
    a full disk or an I/O error: the writers before it in the group must not be told their
    work is saved."""
    async with store.write() as conn:
        await conn.execute(
            sa.text(
                "CREATE TRIGGER doom BEFORE INSERT ON agents WHEN NEW.name = 'doom' "
                "BEGIN SELECT RAISE(ROLLBACK, 'the transaction is gone'); END"
            )
        )

    async def dooms(conn: Connection, slug: str) -> None:
        await _workspace(conn, slug)
        ws = (
            await conn.execute(sa.select(workspaces.c.id).where(workspaces.c.slug == slug))
        ).scalar_one()
        await conn.execute(
            agents.insert().values(
                id=uuid.uuid4(),
                workspace_id=ws,
                name="doom",
                title="",
                adapter="llm",
                config={},
                created_at=NOW,
            )
        )

    results = await _writers(store, [_workspace, _workspace, _workspace, dooms, _workspace])
    # w0 to w2 were in the doomed group with w3.
    assert all(isinstance(r, (sa.exc.DBAPIError, BullpenError)) for r in results[:4]), results
    # The writer after the loss began a new transaction and committed it.
    assert results[4] is None
    assert await _slugs(store) == {"w4"}


async def test_when_the_commit_fails_every_writer_in_the_group_fails(store: Store) -> None:
    """A deferred foreign key checked at COMMIT fails it: the whole group is rolled back and
    each of its writers raises."""

    async def orphan(conn: Connection, slug: str) -> None:
        await _workspace(conn, slug)
        await conn.execute(sa.text("PRAGMA defer_foreign_keys = ON"))
        await conn.execute(
            agents.insert().values(
                id=uuid.uuid4(),
                workspace_id=uuid.uuid4(),  # no such workspace: caught only at COMMIT
                name="orphan",
                title="",
                adapter="llm",
                config={},
                created_at=NOW,
            )
        )

    results = await _writers(store, [_workspace, _workspace, orphan, _workspace])
    assert all(isinstance(r, (sa.exc.DBAPIError, BullpenError)) for r in results), results
    assert await _slugs(store) == set()
    async with store.write() as conn:  # the connection went back to the pool clean
        await _workspace(conn, "after")
    assert await _slugs(store) == {"after"}


async def test_a_group_left_by_a_writer_that_gave_up_its_turn_is_committed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group is handed to the next writer in line; if that one is cancelled before its
    turn comes, the writer waiting for the commit makes it itself."""
    monkeypatch.setattr(GroupCommit, "ORPHAN_CHECK_S", 0.05)
    release = asyncio.Event()

    async def first() -> None:
        async with store.write() as conn:
            await _workspace(conn, "kept")
            await release.wait()

    async def second() -> None:
        async with store.write() as conn:
            await _workspace(conn, "never")

    one = asyncio.create_task(first())
    await asyncio.sleep(0.01)
    two = asyncio.create_task(second())
    await asyncio.sleep(0.01)  # `two` waits for its turn: `one` will hand the group to it
    release.set()
    await asyncio.sleep(0)
    two.cancel()
    # Well before the store's checkpoint loop (every 2 s), which commits a group left open too.
    await asyncio.wait_for(one, 1.5)
    assert "kept" in await _slugs(store)
    with pytest.raises(asyncio.CancelledError):
        await two
    assert "never" not in await _slugs(store)
