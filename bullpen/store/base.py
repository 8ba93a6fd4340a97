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
import contextvars
import fcntl
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.dml import UpdateBase

from bullpen.errors import BullpenError, Unavailable

log = logging.getLogger(__name__)

_UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, OSError)
# SQLSTATEs meaning "the server is away, going away or full", whatever the driver's error
# class: 08 connection exception, 57P01–57P03 shut down / crashed / starting up, 53300 too many
# connections (the server's `max_connections`, or a role's or database's connection limit).
_UNAVAILABLE_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")


def _unreachable(err: BaseException, detail: str | None = None) -> Unavailable | None:
    """`Unavailable` (503) when a driver error means the database is away; else None.

    With `detail` the error names what failed (start-up); without, it asks to retry shortly.
    """
    away = isinstance(err, _UNAVAILABLE)
    if not away and isinstance(err, exc.DBAPIError):
        state = getattr(err.orig, "sqlstate", None) or getattr(err.orig, "pgcode", None)
        away = err.connection_invalidated or (
            isinstance(state, str) and state.startswith(_UNAVAILABLE_SQLSTATES)
        )
    if not away:
        return None
    if detail is not None:
        return Unavailable(detail)
    return Unavailable("the database is unreachable; retry shortly", retry_after=1)


_CHECKPOINT_EVERY_S = 2.0
# Finding 11b: the WAL file is cut back to this size whenever the log starts over (SQLite's
# journal_size_limit), and truncated by a checkpoint once it has grown past it.
WAL_LIMIT_BYTES = 16 * 1024 * 1024
# Execution option marking SQLite write transactions: the engine begins them IMMEDIATE.
WRITE_OPTION = "bullpen_write"
# Execution option marking a write that no cache of rows depends on (a counter): `watch`
# callbacks skip it. The task number counter on the workspace row emptied the API key cache on
# every create, so every request read its key from the database again (issue 21).
UNWATCHED = "bullpen_unwatched"
T = TypeVar("T")


def _info(conn: sa.Connection) -> dict[Any, Any] | None:
    """The connection's info dict, or None once its database connection is gone (invalidated
    by an outage, or closed): asking then would raise or reconnect, and the marks it held
    went with the connection anyway."""
    if conn.invalidated or conn.closed:
        return None
    return conn.info


class Connection(Protocol):
    """What aggregate modules use of a transaction: an AsyncConnection or an InlineConnection."""

    dialect: sa.Dialect

    async def execute(self, statement: Executable, parameters: Any = None, /) -> CursorResult[Any]:
        """Run one statement (a list of parameter dicts runs it once per dict)."""
        ...


def dicts(result: CursorResult[Any]) -> list[dict[str, Any]]:
    """Every row of `result` as a dict of its columns. (`row._mapping` builds a view of the
    column names for each row: 300 rows of the costs page's chart cost a millisecond.)"""
    names = list(result.keys())
    return [dict(zip(names, row, strict=True)) for row in result]


class InlineConnection:
    """A SQLite transaction used directly on the event loop (no thread hop per statement)."""

    def __init__(self, connection: sa.Connection) -> None:
        self.sync_connection = connection
        self.dialect = connection.dialect

    async def execute(self, statement: Executable, parameters: Any = None, /) -> CursorResult[Any]:
        """Run one statement now."""
        return self.sync_connection.execute(statement, parameters)

    async def run_sync(self, fn: Callable[[sa.Connection], T]) -> T:
        """Call `fn` with the underlying synchronous connection."""
        return fn(self.sync_connection)


class Deferred(Protocol):
    """Writes a transaction gathers and makes once, just before it commits."""

    async def flush(self, conn: Connection) -> None:
        """Make the gathered writes on the transaction's connection."""


class _Ambient:
    """The write transaction open in this task, joined by nested read()/write() calls."""

    __slots__ = ("after_commit", "conn", "deferred", "owner")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.after_commit: list[Callable[[], None]] = []
        self.deferred: dict[str, Deferred] = {}
        # Tasks spawned inside the transaction inherit the context var; only its owner joins.
        self.owner = asyncio.current_task()


def _ambient() -> _Ambient | None:
    ambient = _AMBIENT.get()
    return ambient if ambient is not None and ambient.owner is asyncio.current_task() else None


def _at_once(step: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (one that awaits only an
    `InlineConnection`'s statements), run to its end on the calling thread."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    step.close()
    raise RuntimeError("a read apart awaited something other than its statements")


_AMBIENT: contextvars.ContextVar[_Ambient | None] = contextvars.ContextVar(
    "bullpen_ambient_tx", default=None
)


def after_commit(callback: Callable[[], None]) -> None:
    """Call `callback` once the write transaction open in this task commits (now if none
    is open)."""
    ambient = _ambient()
    if ambient is None:
        callback()
    else:
        ambient.after_commit.append(callback)


D = TypeVar("D", bound=Deferred)


def deferred(conn: Connection, key: str, make: Callable[[], D]) -> D | None:
    """The `key` writes gathered by `conn`'s write transaction, open in this task (made by
    `make` at first use), flushed just before it commits, after everything else it did; None
    if `conn` is no such transaction. For rows many transactions update (rollups): flushed
    last and in one order, their locks are taken in one order by everyone, and held briefly."""
    ambient = _ambient()
    if ambient is None or ambient.conn is not conn:
        return None
    found = ambient.deferred.get(key)
    if found is None:
        found = ambient.deferred[key] = make()
    return found  # type: ignore[return-value]


# How many transactions of one `write(turn=...)` key a process runs at once: while one commits,
# the next runs its first statements; a third would only wait in the database (issue 21).
TURN_WIDTH = 2


class _Turns:
    """At most TURN_WIDTH holders at a time per key, the rest waiting in arrival order; a key's
    semaphore lives while it is held or awaited, so keys that come and go (workspaces) leave
    nothing behind."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: dict[Hashable, tuple[asyncio.Semaphore, list[int]]] = {}

    @asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        """Hold one of `key`'s places until the block ends."""
        places, users = self._keys.setdefault(key, (asyncio.Semaphore(TURN_WIDTH), [0]))
        users[0] += 1
        try:
            async with places:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._keys[key]

    def __len__(self) -> int:
        return len(self._keys)


class Store:
    """Access to the database for every aggregate module; the only holder of the engine.

    A `write()` opened while another is open in the same task joins it (one commit for both):
    the API opens the outer transaction when a request's own rows (an idempotency key) must
    commit with what the service writes. `after_commit` callbacks run once the outermost
    transaction has committed.
    """

    def __init__(
        self,
        engine: AsyncEngine | sa.Engine,
        *,
        sqlite_path: str | None = None,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
    ) -> None:
        self.engine = engine
        self.wal_limit_bytes = wal_limit_bytes
        self.dialect = engine.dialect.name
        self.is_sqlite = isinstance(engine, sa.Engine)
        self._sqlite_path = sqlite_path
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        # PostgreSQL reads run in autocommit: at READ COMMITTED a read-only transaction gives
        # no more consistency than its statements do alone, and BEGIN/COMMIT cost two round
        # trips per read. So do writes of one statement (`autocommit`).
        self._autocommit = (
            None
            if isinstance(engine, sa.Engine)
            else engine.execution_options(isolation_level="AUTOCOMMIT")
        )
        self._checkpointer: asyncio.Task[None] | None = None
        self._lock_fd: int | None = None
        self._turns = _Turns()

    def watch(self, tables: frozenset[str], changed: Callable[[], None]) -> None:
        """Call `changed` whenever this process writes one of `tables` (insert, update or
        delete through SQLAlchemy): at the statement, and again at its commit, so that what
        a concurrent reader saw before the commit is forgotten too. For caches of rows."""
        sync_engine = self.engine if isinstance(self.engine, sa.Engine) else self.engine.sync_engine
        flag = f"bullpen_wrote_{id(changed)}"

        def before_execute(conn: sa.Connection, statement: Any, *_: Any) -> None:
            if (
                isinstance(statement, UpdateBase)
                and getattr(statement.table, "name", None) in tables
                and not statement.get_execution_options().get(UNWATCHED)
            ):
                if (info := _info(conn)) is not None:
                    info[flag] = True
                changed()

        def commit(conn: sa.Connection) -> None:
            if (info := _info(conn)) is not None and info.pop(flag, False):
                changed()

        def rollback(conn: sa.Connection) -> None:
            if (info := _info(conn)) is not None:
                info.pop(flag, None)

        sa.event.listen(sync_engine, "before_execute", before_execute)
        sa.event.listen(sync_engine, "commit", commit)
        sa.event.listen(sync_engine, "rollback", rollback)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        """A read-only transaction (inside an open write transaction: that one)."""
        ambient = _ambient()
        if ambient is not None:
            yield ambient.conn
            return
        try:
            if isinstance(self.engine, sa.Engine):
                with self.engine.connect() as sync_conn, sync_conn.begin():
                    yield InlineConnection(sync_conn)
                return
            assert self._autocommit is not None
            async with self._autocommit.connect() as conn:
                yield conn
        except (*_UNAVAILABLE, exc.DBAPIError) as err:
            if (unreachable := _unreachable(err)) is None:
                raise
            raise unreachable from err

    async def read_apart(self, query: Callable[[Connection], Coroutine[Any, Any, T]]) -> T:
        """`query(conn)` in a read-only transaction of its own, off the event loop: for an
        aggregate over many rows (the costs page's), which inline on SQLite would hold up
        every other request while it runs. On SQLite it runs on a worker thread; SQLite
        releases the GIL while it steps through rows, so two such reads run side by side and
        the loop keeps serving. `query` awaits nothing but its statements (on that thread
        they run at once). On PostgreSQL, and inside an open write transaction, it is
        `read()`: the driver already waits off the loop."""
        if not isinstance(self.engine, sa.Engine) or _ambient() is not None:
            async with self.read() as conn:
                return await query(conn)
        engine = self.engine

        def run() -> T:
            with engine.connect() as sync_conn, sync_conn.begin():
                return _at_once(query(InlineConnection(sync_conn)))

        try:
            return await asyncio.to_thread(run)
        except (*_UNAVAILABLE, exc.DBAPIError) as err:
            if (unreachable := _unreachable(err)) is None:
                raise
            raise unreachable from err

    async def write_apart(self, work: Callable[[Connection], Coroutine[Any, Any, T]]) -> T:
        """`work(conn)` in a write transaction of its own, off the event loop: for upkeep that
        writes many rows at once (the search index's batches). On SQLite it runs on a worker
        thread while this process's write lock is held: other writers wait their turn as for
        any write, and the loop goes on serving everything else. `work` awaits nothing but
        its statements, and nothing it does waits for the commit (`after_commit`). On
        PostgreSQL, and inside an open write transaction, it is `write()`."""
        if not isinstance(self.engine, sa.Engine) or _ambient() is not None:
            async with self.write() as conn:
                return await work(conn)
        engine = self.engine

        def run() -> T:
            with engine.connect() as sync_conn:
                sync_conn = sync_conn.execution_options(**{WRITE_OPTION: True})
                with sync_conn.begin():
                    return _at_once(work(InlineConnection(sync_conn)))

        assert self._write_lock is not None
        try:
            async with self._write_lock:
                job = asyncio.ensure_future(asyncio.to_thread(run))
                try:
                    return await asyncio.shield(job)
                except asyncio.CancelledError:
                    # The thread goes on to its commit: the lock stays held until it has, or
                    # the next writer on the loop would wait for SQLite's lock, loop and all.
                    while not job.done():
                        with contextlib.suppress(asyncio.CancelledError):
                            await asyncio.wait({job})
                    raise
        except (*_UNAVAILABLE, exc.DBAPIError) as err:
            if (unreachable := _unreachable(err)) is None:
                raise
            raise unreachable from err

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Connection]:
        """For writes that are each one statement, atomic on its own (an insert of many rows
        is one): on PostgreSQL each commits by itself, one round trip instead of three
        (BEGIN, the statement, COMMIT). On SQLite, and inside an open write transaction, it
        is `write()`."""
        opened = self.write() if isinstance(self.engine, sa.Engine) else self.read()
        async with opened as conn:
            yield conn

    @asynccontextmanager
    async def write(self, *, turn: Hashable | None = None) -> AsyncIterator[Connection]:
        """A read-write transaction (SQLite: BEGIN IMMEDIATE, one writer at a time).

        `turn`: on PostgreSQL this process runs at most TURN_WIDTH transactions with the same
        key at once; the others wait in arrival order before they take a connection. For
        transactions that all lock one hot row (a workspace's task counter): in the database
        each waiter would hold a pooled connection and an open transaction while the row's
        holder waits for the API's COMMIT, and under bursts the queue and the pool fill up
        (issue 21). Correctness never depends on it: the row lock still orders them, and
        other processes' too. SQLite runs every write one at a time already. Inside an open
        write transaction it joins that one: the key is its opener's to give.
        """
        ambient = _ambient()
        if ambient is not None:
            yield ambient.conn
            return
        if turn is not None and self._write_lock is None:
            async with self._turns.turn(turn), self.write() as conn:
                yield conn
            return
        callbacks: list[Callable[[], None]] = []
        try:
            async with self._begin_write() as conn:
                tx = _Ambient(conn)
                token = _AMBIENT.set(tx)
                try:
                    yield conn
                    for pending in tx.deferred.values():
                        await pending.flush(conn)
                finally:
                    _AMBIENT.reset(token)
                    callbacks = tx.after_commit
        except (*_UNAVAILABLE, exc.DBAPIError) as err:
            if (unreachable := _unreachable(err)) is None:
                raise
            raise unreachable from err
        for callback in callbacks:
            callback()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the open write transaction commits (now if none is open)."""
        after_commit(callback)

    @asynccontextmanager
    async def _begin_write(self) -> AsyncIterator[Connection]:
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

    async def run_sync(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run `fn` in one write transaction on a synchronous connection (migrations)."""
        try:
            if isinstance(self.engine, sa.Engine):
                with self.engine.begin() as sync_conn:
                    return fn(sync_conn)
            async with self.engine.begin() as conn:
                return await conn.run_sync(fn)
        except (*_UNAVAILABLE, exc.DBAPIError) as err:
            detail = f"the database is unreachable: {type(err).__name__}"
            if (unreachable := _unreachable(err, detail)) is None:
                raise
            raise unreachable from err

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
                await self.checkpoint()
            except sqlite3.Error as err:
                log.warning("WAL checkpoint failed: %s", err)

    async def checkpoint(self) -> None:
        """SQLite: checkpoint the WAL on a worker thread, and truncate it once it has grown
        past the limit (see `_checkpoint`); a no-op on PostgreSQL or an in-memory database."""
        path = self._sqlite_path
        if path is not None and path != ":memory:":
            await asyncio.to_thread(_checkpoint, path, self.wal_limit_bytes)


def _checkpoint(path: str, wal_limit: int) -> None:
    """A PASSIVE checkpoint on a private connection: it never blocks readers or the writer.

    PASSIVE never shrinks the file: after a burst of writes (above all one that a long reader
    kept the log from starting over during) the WAL stayed at its largest size. So once the
    file is past `wal_limit`, a TRUNCATE checkpoint follows, with no busy wait: if a reader
    still uses the log, or the writer holds its lock, it gives up at once (as PASSIVE) and the
    next round tries again; the writer, on the event loop, waits at most for the last few
    frames to be copied. Meanwhile journal_size_limit cuts the file back whenever a writer
    starts the log over.
    """
    conn = sqlite3.connect(path, timeout=0)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        try:
            size = os.stat(path + "-wal").st_size
        except FileNotFoundError:
            return
        if size > wal_limit:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
