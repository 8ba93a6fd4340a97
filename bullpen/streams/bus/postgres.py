"""PostgreSQL LISTEN/NOTIFY as the bus transport (no other service needed).

A NOTIFY payload holds at most 8000 bytes, so messages are kept under `max_payload`; larger
events travel as stubs and their readers fetch them from the store. Sending uses one
connection and one statement per batch; listening holds another, pinged every 30 s so a
silently dropped connection is noticed. Both reach PostgreSQL itself
(`BULLPEN_DATABASE_DIRECT_URL`), never a transaction-mode pooler, where LISTEN hears nothing.
asyncpg is imported on the first connection, so a SQLite server never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from bullpen.streams.bus.shared import Deliver

CHANNEL = "bullpen_events"
_PING_S = 30.0
_NOTIFY_MANY = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"


class PgNotify:
    """Messages over `NOTIFY bullpen_events`."""

    name = "postgres"
    max_payload = 7900

    def __init__(self, dsn: str, channel: str = CHANNEL) -> None:
        self._dsn = dsn
        self._channel = channel
        self._conn: Any = None

    async def send(self, payloads: list[bytes]) -> None:
        """NOTIFY each payload, in order, in one statement."""
        import asyncpg

        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn)
            await self._conn.execute(_NOTIFY_MANY, self._channel, [p.decode() for p in payloads])
        except BaseException:
            await self._drop()
            raise

    async def listen(self, deliver: Deliver, connected: Callable[[], None]) -> None:
        """LISTEN until the connection is lost."""
        import asyncpg

        conn = await asyncpg.connect(self._dsn)
        try:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(
                self._channel, lambda _conn, _pid, _channel, payload: deliver(payload)
            )
            connected()
            while not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_PING_S):
                        await lost.wait()
                if not lost.is_set():
                    await conn.execute("SELECT 1")
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Close the sending connection."""
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
