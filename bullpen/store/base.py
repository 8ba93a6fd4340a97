"""The Store: one engine, read and write transactions, driver errors mapped at the edge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bullpen.errors import Unavailable

_UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, OSError)


def _sqlite_autocommit(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy, not the driver, decide when transactions begin (see _sqlite_begin).
    dbapi_connection.isolation_level = None


def _sqlite_begin(conn: Any) -> None:
    mode = "IMMEDIATE" if conn.get_execution_options().get("bullpen_write") else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


class Store:
    """Access to the database for every aggregate module; the only holder of the engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.is_sqlite = self.dialect == "sqlite"
        # SQLite has one writer: queue writers here instead of spinning on SQLITE_BUSY.
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        if self.is_sqlite:
            event.listen(engine.sync_engine, "connect", _sqlite_autocommit)
            event.listen(engine.sync_engine, "begin", _sqlite_begin)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction."""
        try:
            async with self.engine.connect() as conn:
                async with conn.begin():
                    yield conn
        except _UNAVAILABLE as err:
            raise Unavailable("the database is unreachable; retry shortly", retry_after=1) from err

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A read-write transaction (SQLite: BEGIN IMMEDIATE under the process's writer lock)."""
        try:
            if self._write_lock is None:
                async with self.engine.begin() as conn:
                    yield conn
                return
            async with self._write_lock, self.engine.connect() as conn:
                conn = await conn.execution_options(bullpen_write=True)
                async with conn.begin():
                    yield conn
        except _UNAVAILABLE as err:
            raise Unavailable("the database is unreachable; retry shortly", retry_after=1) from err

    def pool_status(self) -> tuple[int, int]:
        """(connections in use, pool capacity) for metrics."""
        pool: Any = self.engine.pool
        return int(pool.checkedout()), int(pool.size()) + int(getattr(pool, "_max_overflow", 0))

    async def close(self) -> None:
        """Dispose of every pooled connection."""
        await self.engine.dispose()
