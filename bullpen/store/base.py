"""The Store: one engine, read and write transactions, driver errors mapped at the edge.

PostgreSQL runs on asyncpg. SQLite runs inline on the event loop: its statements take tens of
microseconds in-process, far less than handing each one to a driver thread and back (which,
measured under load, cost 5–15 ms per statement in GIL hand-offs). Transactions therefore never
suspend between statements; writers queue on one asyncio lock (SQLite has one writer), and WAL
checkpoints run on a worker thread so no fsync happens on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.base import Executable

from bullpen.errors import BullpenError, Unavailable

log = logging.getLogger(__name__)

_UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, OSError)
_CHECKPOINT_EVERY_S = 2.0
# Execution option marking SQLite write transactions: the engine begins them IMMEDIATE.
WRITE_OPTION = "bullpen_write"
T = TypeVar("T")


class Connection(Protocol):
    """What aggregate modules use of a transaction: an AsyncConnection or an InlineConnection."""

    async def execute(self, statement: Executable, parameters: Any = None, /) -> CursorResult[Any]:
        """Run one statement (a list of parameter dicts runs it once per dict)."""
        ...


class InlineConnection:
    """A SQLite transaction used directly on the event loop (no thread hop per statement)."""

    def __init__(self, connection: sa.Connection) -> None:
        self.sync_connection = connection

    async def execute(self, statement: Executable, parameters: Any = None, /) -> CursorResult[Any]:
        """Run one statement now."""
        return self.sync_connection.execute(statement, parameters)

    async def run_sync(self, fn: Callable[[sa.Connection], T]) -> T:
        """Call `fn` with the underlying synchronous connection."""
        return fn(self.sync_connection)


class Store:
    """Access to the database for every aggregate module; the only holder of the engine."""

    def __init__(self, engine: AsyncEngine | sa.Engine, *, sqlite_path: str | None = None) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.is_sqlite = isinstance(engine, sa.Engine)
        self._sqlite_path = sqlite_path
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        self._checkpointer: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        """A read-only transaction."""
        try:
            if isinstance(self.engine, sa.Engine):
                with self.engine.connect() as sync_conn, sync_conn.begin():
                    yield InlineConnection(sync_conn)
                return
            async with self.engine.connect() as conn, conn.begin():
                yield conn
        except _UNAVAILABLE as err:
            raise Unavailable("the database is unreachable; retry shortly", retry_after=1) from err

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Connection]:
        """A read-write transaction (SQLite: BEGIN IMMEDIATE, one writer at a time)."""
        try:
            if isinstance(self.engine, sa.Engine):
                assert self._write_lock is not None
                async with self._write_lock:
                    with self.engine.connect() as sync_conn:
                        sync_conn = sync_conn.execution_options(**{WRITE_OPTION: True})
                        with sync_conn.begin():
                            yield InlineConnection(sync_conn)
                return
            async with self.engine.begin() as conn:
                yield conn
        except _UNAVAILABLE as err:
            raise Unavailable("the database is unreachable; retry shortly", retry_after=1) from err

    async def run_sync(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run `fn` in one write transaction on a synchronous connection (migrations)."""
        try:
            if isinstance(self.engine, sa.Engine):
                with self.engine.begin() as sync_conn:
                    return fn(sync_conn)
            async with self.engine.begin() as conn:
                return await conn.run_sync(fn)
        except _UNAVAILABLE as err:
            raise Unavailable(f"the database is unreachable: {type(err).__name__}") from err

    def pool_status(self) -> tuple[int, int]:
        """(connections in use, pool capacity) for metrics."""
        pool: Any = self.engine.pool
        return int(pool.checkedout()), int(pool.size()) + int(getattr(pool, "_max_overflow", 0))

    def lock_sqlite(self) -> None:
        """Claim the SQLite file for this process (another's write lock would stall our loop)."""
        path = self._sqlite_path
        if path is None or path == ":memory:" or self._lock_fd is not None:
            return
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BullpenError(
                f"another Bullpen process is using {path}; run one process per "
                "SQLite data directory (use PostgreSQL for several)"
            ) from None
        self._lock_fd = fd

    def start(self) -> None:
        """Start background upkeep (SQLite: WAL checkpoints off the event loop)."""
        if self._sqlite_path is not None and self._checkpointer is None:
            self._checkpointer = asyncio.create_task(self._checkpoint_loop(), name="bullpen-wal")

    async def close(self) -> None:
        """Stop upkeep and dispose of every pooled connection."""
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpointer
            self._checkpointer = None
        if isinstance(self.engine, sa.Engine):
            self.engine.dispose()
        else:
            await self.engine.dispose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _checkpoint_loop(self) -> None:
        assert self._sqlite_path is not None
        while True:
            await asyncio.sleep(_CHECKPOINT_EVERY_S)
            try:
                await asyncio.to_thread(_checkpoint, self._sqlite_path)
            except sqlite3.Error as err:
                log.warning("WAL checkpoint failed: %s", err)


def _checkpoint(path: str) -> None:
    """A PASSIVE checkpoint on a private connection: never blocks readers or the writer."""
    conn = sqlite3.connect(path, timeout=1)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        conn.close()
