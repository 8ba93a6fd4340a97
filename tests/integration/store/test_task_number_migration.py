"""Migrations 0011 and 0012 on PostgreSQL: a workspace's task numbers move from its counter to
its own sequence (0011) and back (0012), each going on where the other stopped, both ways."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic import command

from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.migrate import alembic_config
from tests.support.postgres import empty_store

pytestmark = pytest.mark.usefixtures("pg_available")


@pytest.fixture
async def bare() -> AsyncIterator[Store]:
    """A store on an empty PostgreSQL database of its own (no migration run)."""
    async with empty_store("bullpen_m11") as store:
        yield store


async def _to(store: Store, revision: str, *, down: bool = False) -> None:
    def move(connection: sa.Connection) -> None:
        config = alembic_config(connection)
        if down:
            command.downgrade(config, revision)
        else:
            command.upgrade(config, revision)

    await store.run_sync(move)


def _sequence(workspace_id: uuid.UUID) -> str:
    return f"bullpen_task_numbers_{workspace_id.hex}"


async def _scalar(store: Store, sql: str, **params: object) -> object:
    async with store.read() as conn:
        return (await conn.execute(sa.text(sql), params)).scalar()


async def _workspace_row(store: Store, key: str, counter: int) -> uuid.UUID:
    """A workspace written as a row (no sequence made for it), its counter at `counter`."""
    ws = uuid.uuid4()
    async with store.write() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO workspaces (id, name, slug, task_key, task_counter, created_at) "
                "VALUES (:id, :key, :slug, :key, :counter, :now)"
            ),
            {
                "id": ws,
                "key": key,
                "slug": key.lower(),
                "counter": counter,
                "now": datetime.now(UTC),
            },
        )
    return ws


async def _next_in_sequence(store: Store, workspace_id: uuid.UUID) -> object:
    async with store.write() as conn:
        sql = "SELECT nextval(CAST(:name AS regclass))"
        return (await conn.execute(sa.text(sql), {"name": _sequence(workspace_id)})).scalar()


async def test_numbers_go_on_across_the_counter_and_the_sequence(bare: Store) -> None:
    await _to(bare, "0010")
    ws = await _workspace_row(bare, "OLD", 41)
    await _to(bare, "0011")  # the sequence starts after the counter
    assert await _next_in_sequence(bare, ws) == 42
    assert await _next_in_sequence(bare, ws) == 43
    await _to(bare, "head")  # the counter goes on after the sequence, which is gone
    async with bare.write() as conn:
        assert await task_store.next_task_number(conn, ws) == (44, "OLD")
    assert await _scalar(bare, "SELECT to_regclass(:name)", name=_sequence(ws)) is None
    await _to(bare, "0011", down=True)  # and back: the sequence starts after the counter
    assert await _next_in_sequence(bare, ws) == 45
    await _to(bare, "0010", down=True)
    counter = await _scalar(bare, "SELECT task_counter FROM workspaces WHERE id = :id", id=ws)
    left = await _scalar(bare, "SELECT to_regclass(:name)", name=_sequence(ws))
    assert (counter, left) == (45, None)


async def test_a_workspace_without_numbers_keeps_its_counter(bare: Store) -> None:
    await _to(bare, "0010")
    ws = await _workspace_row(bare, "NEW", 0)
    await _to(bare, "head")  # its sequence never handed out a number
    async with bare.write() as conn:
        assert await task_store.next_task_number(conn, ws) == (1, "NEW")


async def test_a_workspace_without_a_sequence_keeps_its_counter(bare: Store) -> None:
    """A workspace row written at 0011 without its sequence (by hand) does not stop 0012."""
    await _to(bare, "0011")
    ws = await _workspace_row(bare, "BARE", 7)
    await _to(bare, "head")
    async with bare.write() as conn:
        assert await task_store.next_task_number(conn, ws) == (8, "BARE")
