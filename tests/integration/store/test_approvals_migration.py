"""Migration 0013 on both backends, down and up again: the change log loses its notices and
keeps its task changes (its triggers still write them), and the approval columns and table go
and come back."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from bullpen.store import changes
from bullpen.store.base import Store
from bullpen.store.migrate import alembic_config
from bullpen.store.notices import add_notice
from tests.support.seed import NOW, new_task, workspace_with_agent


async def _to(store: Store, revision: str, *, down: bool = False) -> None:
    def move(connection: sa.Connection) -> None:
        config = alembic_config(connection)
        if down:
            command.downgrade(config, revision)
        else:
            command.upgrade(config, revision)

    await store.run_sync(move)


def _columns(store: Store, table: str) -> set[str]:
    def read(connection: sa.Connection) -> set[str]:
        return {c["name"] for c in sa.inspect(connection).get_columns(table)}

    return store.run_sync(read)  # type: ignore[return-value]


async def test_0013_goes_down_and_up_again(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    await new_task(store, ws, agent)
    async with store.write() as conn:
        await add_notice(conn, ws, "approval.requested", {"approval_id": "a"}, NOW)
    await _to(store, "0012", down=True)
    assert "approver" not in await _columns(store, "memberships")
    assert "requires_approval" not in await _columns(store, "agents")
    assert {"kind", "data"}.isdisjoint(await _columns(store, "task_changes"))
    async with store.read() as conn:
        kept = (await conn.execute(sa.text("SELECT count(*) FROM task_changes"))).scalar()
        tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())  # type: ignore[attr-defined]
    assert kept == 1 and "approvals" not in tables
    await _to(store, "head")
    await new_task(store, ws, agent)  # the triggers still log task changes
    async with store.write() as conn:
        await add_notice(conn, ws, "approval.decided", {}, NOW)
    async with store.read() as conn:
        page, _ = await changes.after(conn, ws, changes.START, 10)
    assert [getattr(c, "kind", "task") for c in page] == ["task", "task", "approval.decided"]
