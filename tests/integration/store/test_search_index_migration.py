"""Migration 0023 (SQLite): the search index moves off the create path. Tasks indexed by
0020's trigger stay indexed and searchable; new ones wait in `tasks_search_pending`; going
down indexes whatever is pending and brings back 0020's triggers. PostgreSQL: no change."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.migrate import alembic_config
from tests.support.seed import NOW, new_task, workspace_with_agent


async def _move(store: Store, target: str, *, down: bool = False) -> set[str]:
    def move(connection: sa.Connection) -> set[str]:
        (command.downgrade if down else command.upgrade)(alembic_config(connection), target)
        return set(sa.inspect(connection).get_table_names())

    return await store.run_sync(move)


async def _indexed_and_pending(store: Store) -> tuple[int, int]:
    async with store.read() as conn:
        indexed = await conn.execute(
            sa.text("SELECT count(*) FROM tasks_search WHERE tasks_search MATCH '\"ppppp\"'")
        )
        pending = await conn.execute(sa.text("SELECT count(*) FROM tasks_search_pending"))
        return int(indexed.scalar_one()), int(pending.scalar_one())


async def _whole(store: Store) -> None:
    async with store.write() as conn:  # FTS5 compares its index with the tasks; raises if not
        await conn.execute(
            sa.text("INSERT INTO tasks_search (tasks_search, rank) VALUES ('integrity-check', 1)")
        )


async def test_0023_keeps_what_0020_indexed_and_goes_down_and_up(bare: Store) -> None:
    await _move(bare, "0022")
    ws, agent = await workspace_with_agent(bare)
    for _ in range(3):
        await new_task(bare, ws, agent, NOW)  # its prompt is ten p's
    tables = await _move(bare, "0023")
    if not bare.is_sqlite:
        assert "tasks_search_pending" not in tables
        return
    assert await _indexed_and_pending(bare) == (3, 0)
    await new_task(bare, ws, agent, NOW)
    assert await _indexed_and_pending(bare) == (3, 1)
    assert "tasks_search_pending" not in await _move(bare, "0022", down=True)
    await _whole(bare)  # the pending task went into the index on the way down
    await new_task(bare, ws, agent, NOW)  # 0020's trigger indexes it at once
    await _whole(bare)
    await _move(bare, "0023")
    await new_task(bare, ws, agent, NOW)
    assert await _indexed_and_pending(bare) == (5, 1)
    assert await task_store.index_all_pending(bare) == 1
    assert await _indexed_and_pending(bare) == (6, 0)
    await _whole(bare)
