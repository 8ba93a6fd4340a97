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
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Iterator
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


@contextlib.contextmanager
def _away_as_unavailable() -> Iterator[None]:
    """Driver errors that mean the database is away leave as `Unavailable`; others as they are."""
    try:
        yield
    except (*_UNAVAILABLE, exc.DBAPIError) as err:
        if (unreachable := _unreachable(err)) is None:
            raise
        raise unreachable from err


# Often: under a stream of writes the WAL grows by tens of MB a second, and what a checkpoint
# finds to copy (and the file it empties, writers held) grows with the time since the last.
_CHECKPOINT_EVERY_S = 0.25
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


def upsert_insert(dialect: str) -> Callable[[sa.Table], Any]:
    """The `insert()` of `dialect` (a name), which has its ON CONFLICT clauses.

    PostgreSQL's is imported on its first use, so a SQLite server never loads that dialect.
    """
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        return insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert


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


class _Group:
    """One SQLite transaction that writers following each other share."""

    __slots__ = ("conn", "done", "members", "opened_at", "sync_conn", "tx")

    def __init__(self, sync_conn: sa.Connection) -> None:
        self.sync_conn = sync_conn
        self.tx = sync_conn.begin()
        self.conn = InlineConnection(sync_conn)
        self.members = 0  # writers whose work is in it, waiting for its commit
        self.opened_at = time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Its error is each member's to raise; none may be left (the last one raises it).
        self.done.add_done_callback(lambda f: f.cancelled() or f.exception())


class GroupCommit:
    """SQLite's writes, one at a time and committed in groups.

    A commit writes every page its transaction changed to the WAL, and the checkpoint copies
    each one into the database again. A task's create changes one page in each of 33 b-trees
    (its rows' tables and their indexes): 36 WAL frames, 150 KB, measured under the create
    bench, where commits took a third of the server's time. Nearly all of those pages are the
    right-hand edges of time-ordered keys, which the next create changes again. So a writer
    that ends while others wait for their turn leaves the transaction open, and the next one
    goes on in it; the writer that finds nobody waiting, or the group past MAX_MEMBERS or
    MAX_AGE_S, commits for all. Each writer's work runs in a savepoint of its own: one that
    fails is rolled back alone. Nothing is acknowledged before it is durable: a writer's
    `write()` returns only once its group has committed, and when the commit fails (or SQLite
    rolled the whole transaction back), every writer in the group gets the error.
    """

    MAX_MEMBERS = 64
    MAX_AGE_S = 0.005
    # A member that waited this long for its group's commit commits it itself, in its turn:
    # the writer it was left to may have given up before its turn came.
    ORPHAN_CHECK_S = 0.1

    def __init__(self, engine: sa.Engine, lock: asyncio.Lock) -> None:
        self._engine = engine
        self._lock = lock
        self._queued = 0  # writers waiting for the lock
        self._group: _Group | None = None

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Connection]:
        """A turn to write, in the group's transaction."""
        self._queued += 1
        try:
            await self._lock.acquire()
        finally:
            self._queued -= 1
        try:
            group = self._group or self._open()
            savepoint = group.sync_conn.begin_nested()
        except BaseException:
            self._lock.release()
            raise
        try:
            yield group.conn
            savepoint.commit()  # RELEASE: the work stays, in the group's transaction
        except BaseException as failed:
            try:
                self._roll_back(group, savepoint, failed)
            finally:
                self._end_turn(group)
            raise
        group.members += 1
        if self._group is group and self._hand_over(group):
            self._lock.release()
            await self._committed(group)
            return
        self._end_turn(group)
        group.done.result()  # this writer's own commit: raise its error

    async def settle(self) -> None:
        """Commit a group left open (its errors are its members'); at close, and by the
        checkpoint loop as a safety net."""
        if self._group is not None:
            async with self._lock:
                self.settle_holding_lock()

    def settle_holding_lock(self) -> None:
        """Commit the open group, if any, before work of the lock's that is not a group's."""
        if self._group is not None:
            self._commit(self._group)

    def _open(self) -> _Group:
        sync_conn = self._engine.connect().execution_options(**{WRITE_OPTION: True})
        try:
            self._group = _Group(sync_conn)
        except BaseException:
            sync_conn.close()
            raise
        return self._group

    def _hand_over(self, group: _Group) -> bool:
        return (
            self._queued > 0
            and group.members < self.MAX_MEMBERS
            and time.monotonic() - group.opened_at < self.MAX_AGE_S
        )

    def _end_turn(self, group: _Group) -> None:
        """Leave the group to the next writer, or commit it; then let the next one in."""
        try:
            if self._group is group and not self._hand_over(group):
                self._commit(group)
        finally:
            self._lock.release()

    def _roll_back(
        self, group: _Group, savepoint: sa.engine.NestedTransaction, failed: BaseException
    ) -> None:
        """Undo a failed writer's work; when SQLite ended the whole transaction (a full disk,
        an I/O error), the group's other writers fail with it."""
        try:
            savepoint.rollback()
            intact = group.sync_conn.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
        except exc.DBAPIError:
            intact = False
        if not intact:
            self._close(group, failed)

    def _commit(self, group: _Group) -> None:
        try:
            group.tx.commit()
        except BaseException as err:
            self._close(group, err)
            return
        self._close(group, None)

    def _close(self, group: _Group, error: BaseException | None) -> None:
        if self._group is group:
            self._group = None
        try:
            if error is not None and group.tx.is_active:
                group.tx.rollback()
            # A COMMIT that failed on a deferred constraint leaves SQLite's transaction open,
            # and SQLAlchemy, whose transaction has ended, would pool the connection as is.
            dbapi = group.sync_conn.connection.dbapi_connection
            if error is not None and dbapi is not None and dbapi.in_transaction:
                dbapi.rollback()
        except (exc.DBAPIError, sqlite3.Error):
            pass  # nothing left to roll back
        finally:
            group.sync_conn.close()
            if not group.done.done():
                if error is None:
                    group.done.set_result(None)
                else:
                    group.done.set_exception(error)

    async def _committed(self, group: _Group) -> None:
        while not group.done.done():
            await asyncio.wait({group.done}, timeout=self.ORPHAN_CHECK_S)
            if not group.done.done():
                async with self._lock:
                    if self._group is group:
                        self._commit(group)
        group.done.result()


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
        self._groups = (
            GroupCommit(engine, self._write_lock)
            if isinstance(engine, sa.Engine) and self._write_lock is not None
            else None
        )
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
        with _away_as_unavailable():
            if isinstance(self.engine, sa.Engine):
                with self.engine.connect() as sync_conn, sync_conn.begin():
                    yield InlineConnection(sync_conn)
                return
            assert self._autocommit is not None
            async with self._autocommit.connect() as conn:
                yield conn

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

        with _away_as_unavailable():
            return await asyncio.to_thread(run)

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

        with _away_as_unavailable():
            return await self._holding_write_turn(run)

    async def _holding_write_turn(self, fn: Callable[[], T]) -> T:
        """SQLite: `fn()` on a worker thread while this process's write lock is held."""
        assert self._write_lock is not None and self._groups is not None
        async with self._write_lock:
            self._groups.settle_holding_lock()
            job = asyncio.ensure_future(asyncio.to_thread(fn))
            try:
                return await asyncio.shield(job)
            except asyncio.CancelledError:
                # The thread goes on to its end: the lock stays held until it gets there, or
                # the next writer on the loop would wait for SQLite's lock, loop and all.
                while not job.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.wait({job})
                raise

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
        with _away_as_unavailable():
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
        for callback in callbacks:
            callback()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the open write transaction commits (now if none is open)."""
        after_commit(callback)

    @asynccontextmanager
    async def _begin_write(self) -> AsyncIterator[Connection]:
        if self._groups is not None:
            async with self._groups.write() as conn:
                yield conn
            return
        assert isinstance(self.engine, AsyncEngine)
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
        if self._groups is not None:
            await self._groups.settle()
        if isinstance(self.engine, sa.Engine):
            self.engine.dispose()
        else:
            await self.engine.dispose()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    async def _checkpoint_loop(self) -> None:
        assert self._sqlite_path is not None
        assert self._groups is not None
        while True:
            await asyncio.sleep(_CHECKPOINT_EVERY_S)
            try:
                await self._groups.settle()
                await self.checkpoint()
            except sqlite3.Error as err:
                log.warning("WAL checkpoint failed: %s", err)

    async def checkpoint(self) -> None:
        """SQLite: checkpoint the WAL on a worker thread, and start it over once it has grown
        past the limit; a no-op on PostgreSQL or an in-memory database.

        A PASSIVE checkpoint never blocks the writer or a reader, but it never lets the log
        start over either while writes keep coming: a writer starts the WAL over only when
        every frame in it has been copied back, and under a steady stream of writes there are
        always newer ones. Measured under the create bench, the WAL grew to 640 MB in 40 s,
        and the commits that kept appending to it spent a third of the server's time in
        `pwrite`. So once the file is past the limit, a TRUNCATE checkpoint follows while this
        process's write lock is held: no frame can be added meanwhile, it copies the few
        written since the PASSIVE one and empties the file, and the next writer starts the
        log over from its beginning. Writers wait on the loop's lock, not on SQLite's, so the
        loop keeps serving; a reader still on old frames makes it give up after
        `_TRUNCATE_WAIT_S`, and the next round tries again.
        """
        path = self._sqlite_path
        if path is None or path == ":memory:":
            return
        if await asyncio.to_thread(_checkpoint, path) > self.wal_limit_bytes:
            await self._holding_write_turn(lambda: _truncate(path))


# How long the TRUNCATE checkpoint waits for readers of old frames, writers held meanwhile.
_TRUNCATE_WAIT_S = 0.05


def _checkpoint(path: str) -> int:
    """A PASSIVE checkpoint on a private connection (it never blocks readers or the writer);
    returns the WAL file's size after it."""
    conn = sqlite3.connect(path, timeout=0)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        conn.close()
    try:
        return os.stat(path + "-wal").st_size
    except FileNotFoundError:
        return 0


def _truncate(path: str) -> None:
    """A TRUNCATE checkpoint on a private connection, waiting at most `_TRUNCATE_WAIT_S` for
    readers; the caller holds the process's write lock."""
    conn = sqlite3.connect(path, timeout=_TRUNCATE_WAIT_S)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
