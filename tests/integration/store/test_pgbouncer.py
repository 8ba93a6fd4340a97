"""The store through PgBouncer 1.18 in transaction mode, with two server connections for many
clients, so that consecutive statements of one client land on different server connections:
migrations on an empty database, concurrent statements (named or cached prepared statements
would collide or go missing), the idle-in-transaction timeout of write transactions, and the
clear refusal when the pooler setting is missing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from bullpen.app import open_store
from bullpen.errors import Unavailable
from bullpen.settings import Settings
from bullpen.store.tables import workspaces
from tests.support.pgbouncer import PgBouncer, running_pgbouncer
from tests.support.postgres import admin, db_url

IDLE_S = 12.5  # PostgreSQL shows it as 12500 ms


@pytest.fixture
def small_pool(pg_available: bool) -> Iterator[PgBouncer]:
    """A PgBouncer of its own with two server connections per database."""
    with running_pgbouncer(pool_size=2) as bouncer:
        yield bouncer


@pytest.fixture
async def empty_database(pg_available: bool) -> AsyncIterator[str]:
    """A database with no schema yet."""
    name = f"bullpen_t_{uuid.uuid4().hex[:12]}"
    await admin(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _settings(bouncer: PgBouncer, name: str, **fields: object) -> Settings:
    return Settings(
        data_dir=Path("/nonexistent"),
        database_url=bouncer.url(name),
        database_direct_url=db_url(name),
        **fields,  # type: ignore[arg-type]
    )


async def test_the_store_migrates_and_serves_many_clients_through_two_connections(
    small_pool: PgBouncer, empty_database: str
) -> None:
    settings = _settings(
        small_pool,
        empty_database,
        database_pooler="pgbouncer",
        db_idle_transaction_timeout_s=IDLE_S,
    )
    async with open_store(settings) as store:  # the migrations ran through the pooler

        async def read(i: int) -> int:
            async with store.read() as conn:
                query = sa.select(sa.cast(sa.literal(i), sa.Integer) + 1)
                return int((await conn.execute(query)).scalar_one())

        async def write(i: int) -> str:
            async with store.write() as conn:
                idle = (
                    await conn.execute(
                        sa.text(
                            "SELECT setting FROM pg_settings"
                            " WHERE name = 'idle_in_transaction_session_timeout'"
                        )
                    )
                ).scalar_one()
                await asyncio.sleep(0)  # let the other clients' statements in between
                count = (
                    await conn.execute(sa.select(sa.func.count()).select_from(workspaces))
                ).scalar_one()
                assert count >= 0
                assert i == (await conn.execute(sa.select(sa.literal(i)))).scalar_one()
                return str(idle)

        reads = await asyncio.gather(*(read(i) for i in range(300)))
        assert reads == [i + 1 for i in range(300)]
        idles = await asyncio.gather(*(write(i) for i in range(60)))
        assert set(idles) == {str(round(IDLE_S * 1000))}


async def test_a_pooled_url_without_the_pooler_setting_is_refused_with_what_to_set(
    small_pool: PgBouncer, empty_database: str
) -> None:
    settings = _settings(small_pool, empty_database)
    with pytest.raises(Unavailable, match="BULLPEN_DATABASE_POOLER=pgbouncer"):
        async with open_store(settings):
            pass
