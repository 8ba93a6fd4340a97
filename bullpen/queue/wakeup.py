"""Wake-ups: a run was enqueued, so idle workers should claim now rather than at their next poll.

In one process (SQLite, or `bullpen up`) the API calls the worker directly. On PostgreSQL the
API also sends `NOTIFY bullpen_runs` (throttled: at most one per `min_gap_s`, the last one
always sent, so a burst of creates costs a few notifications, not one each) and every worker
process LISTENs on its own connection. The worker's slow poll remains the safety net for a
notification lost while a listener reconnects.

Both connect to PostgreSQL itself (`BULLPEN_DATABASE_DIRECT_URL`, by default the database URL):
a pooler in transaction mode hands each transaction to any server connection, so a LISTEN
made through it would hear nothing. asyncpg is imported when one starts, so a SQLite server
never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Self

log = logging.getLogger(__name__)

CHANNEL = "bullpen_runs"


def asyncpg_dsn(database_url: str) -> str:
    """The plain libpq URL asyncpg takes, from Bullpen's SQLAlchemy URL."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://", 1)


class _Background:
    """A component whose `_run` loop runs as a task between `async with` enter and exit."""

    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run(), name=f"bullpen-{type(self).__name__}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        raise NotImplementedError


class Notifier(_Background):
    """Sends throttled `NOTIFY bullpen_runs` after enqueues (PostgreSQL)."""

    def __init__(self, dsn: str, *, min_gap_s: float = 0.002) -> None:
        self._dsn = dsn
        self._min_gap_s = min_gap_s
        self._pending = False
        self._last = 0.0
        self._wake = asyncio.Event()
        self.sent = 0

    def enqueued(self) -> None:
        """Note an enqueue; a notification follows within `min_gap_s`."""
        self._pending = True
        self._wake.set()

    async def _run(self) -> None:
        import asyncpg

        conn: Any = None
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                gap = self._last + self._min_gap_s - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
                if not self._pending:
                    continue
                self._pending = False
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(self._dsn)
                    await conn.execute(f"NOTIFY {CHANNEL}")
                    self.sent += 1
                except (
                    OSError,
                    TimeoutError,
                    asyncpg.PostgresError,
                    asyncpg.InterfaceError,
                ) as err:
                    log.warning("could not notify workers (they will poll): %s", err)
                    conn = None
                    await asyncio.sleep(1.0)
                self._last = time.monotonic()
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()


class Listener(_Background):
    """Calls `on_wake` for every `NOTIFY bullpen_runs`; reconnects when the database returns."""

    def __init__(self, dsn: str, on_wake: Callable[[], None]) -> None:
        self._dsn = dsn
        self._on_wake = on_wake
        self.connected = asyncio.Event()

    def _notified(self, *_args: object) -> None:
        self._on_wake()

    async def _run(self) -> None:
        import asyncpg

        while True:
            conn: Any = None
            try:
                conn = await asyncpg.connect(self._dsn)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(CHANNEL, self._notified)
                self.connected.set()
                self._on_wake()  # anything enqueued while we were not listening
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(30):
                            await lost.wait()
                    if not lost.is_set():
                        await conn.execute("SELECT 1")  # notice a silently dropped connection
            except Exception as err:  # whatever broke, listen again: the poll covers the gap
                log.warning("listening for enqueues failed (polling meanwhile): %r", err)
            finally:
                self.connected.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(1.0)
