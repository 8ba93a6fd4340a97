"""Reading a running server's database in tests: rows, counts and audit events."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from bullpen.store.tables import audit_events
from tests.support.servers import RunningServer


async def rows(server: RunningServer, query: Any) -> list[Any]:
    """Every row the query selects."""
    async with server.services.store.read() as conn:
        return list(await conn.execute(query))


async def count(server: RunningServer, table: sa.Table, *where: Any) -> int:
    """How many rows of `table` match every `where` clause."""
    query = sa.select(sa.func.count()).select_from(table)
    if where:
        query = query.where(*where)
    async with server.services.store.read() as conn:
        return int((await conn.execute(query)).scalar_one())


async def audits(server: RunningServer, action: str) -> list[Any]:
    """The audit events with this action, oldest first."""
    return await rows(
        server,
        sa.select(audit_events)
        .where(audit_events.c.action == action)
        .order_by(audit_events.c.created_at),
    )


@contextmanager
def statements_with(server: RunningServer, text: str) -> Iterator[list[str]]:
    """The statements holding `text` that the server sends while inside."""
    sent: list[str] = []
    engine = server.services.store.engine
    sync_engine = engine if isinstance(engine, sa.Engine) else engine.sync_engine

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if text in statement:
            sent.append(statement)

    sa.event.listen(sync_engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        sa.event.remove(sync_engine, "before_cursor_execute", seen)


@contextmanager
def key_reads(server: RunningServer) -> Iterator[list[str]]:
    """The statements reading `api_keys` that the server sends while inside."""
    with statements_with(server, "FROM api_keys") as lookups:
        yield lookups
