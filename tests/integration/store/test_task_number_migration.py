"""Migration 0011 on PostgreSQL: a workspace's task numbers move from its counter to its own
sequence and go on where the counter stopped; the downgrade hands them back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from bullpen.settings import Settings
from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from bullpen.store.migrate import alembic_config
from tests.support.postgres import admin, db_url

pytestmark = pytest.mark.usefixtures("pg_available")


@pytest.fixture
async def bare() -> AsyncIterator[Store]:
    """A store on an empty PostgreSQL database of its own (no migration run)."""
    name = f"bullpen_m11_{uuid.uuid4().hex[:12]}"
    await admin(f'CREATE DATABASE "{name}"')
    store = create_store(Settings(database_url=db_url(name), data_dir=Path("/nonexistent")))
    try:
        yield store
    finally:
        await store.close()
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _to(store: Store, revision: str, *, down: bool = False) -> None:
    def move(connection: sa.Connection) -> None:
        config = alembic_config(connection)
        if down:
            command.downgrade(config, revision)
        else:
            command.upgrade(config, revision)

    await store.run_sync(move)


async def test_numbers_go_on_from_the_counter_and_back(bare: Store) -> None:
    await _to(bare, "0010")
    ws = uuid.uuid4()
    async with bare.write() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO workspaces (id, name, slug, task_key, task_counter, created_at) "
                "VALUES (:id, 'Old', 'old', 'OLD', 41, :now)"
            ),
            {"id": ws, "now": datetime.now(UTC)},
        )
    await _to(bare, "head")
    async with bare.write() as conn:
        assert await task_store.next_task_number(conn, ws) == (42, "OLD")
        assert await task_store.next_task_number(conn, ws) == (43, "OLD")
    await _to(bare, "0010", down=True)
    async with bare.read() as conn:
        counter = (
            await conn.execute(
                sa.text("SELECT task_counter FROM workspaces WHERE id = :id"), {"id": ws}
            )
        ).scalar()
        left = (
            await conn.execute(
                sa.text("SELECT to_regclass(:name)"), {"name": task_store.number_sequence(ws)}
            )
        ).scalar()
    assert (counter, left) == (43, None)
