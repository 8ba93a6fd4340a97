"""The SQLite WAL stays bounded (issue 19, finding 11b).

A burst of writes while a reader holds an old snapshot grows the WAL: nothing written after the
snapshot can be checkpointed, so the log cannot start over and only grows. Once the reader is
done, the store's periodic checkpoint must bring the file back down by itself, with no further
write needed (it used to stay at its largest size for good: 181 MB beside a 6 MB database).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from bullpen.domain.events import EventKind, RunEvent
from bullpen.settings import Settings
from bullpen.store import events as event_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import run_events
from tests.support.seed import NOW, new_task, workspace_with_agent

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

MIB = 1024 * 1024
BURST_MIB = 40  # well past the default limit
WAL_LIMIT_MIB = 16  # BULLPEN_SQLITE_WAL_LIMIT_MB's default


def wal_size(settings: Settings) -> int:
    path = Path(str(settings.data_dir / "bullpen.db") + "-wal")
    return path.stat().st_size if path.exists() else 0


async def events_count(conn: Connection) -> int:
    query = sa.select(sa.func.count()).select_from(run_events)
    return int((await conn.execute(query)).scalar_one())


async def test_the_wal_shrinks_after_a_burst_once_a_long_reader_is_done(
    store: Store, settings: Settings
) -> None:
    async with store.read() as conn:  # every connection cuts the log back when it restarts
        limit = (await conn.execute(sa.text("PRAGMA journal_size_limit"))).scalar_one()
    assert limit == settings.sqlite_wal_limit_mb * MIB == WAL_LIMIT_MIB * MIB
    ws, agent = await workspace_with_agent(store)
    task_id, run_id = await new_task(store, ws, agent)
    text = os.urandom(100_000).hex()  # 200 kB of JSON text per event, not compressible
    per_tx = 2
    transactions = BURST_MIB * MIB // (per_tx * len(text)) + 1
    seq = 0

    async with store.read() as reader:
        before = await events_count(reader)  # the reader's snapshot is now taken
        for _ in range(transactions):
            events = []
            for _ in range(per_tx):
                seq += 1
                events.append(RunEvent(run_id, task_id, seq, EventKind.TEXT, {"text": text}))
            async with store.write() as conn:
                await event_store.append(conn, events, [ws] * per_tx, NOW)
            await asyncio.sleep(0)  # the periodic checkpoint may run meanwhile
        grown = wal_size(settings)
        assert grown > BURST_MIB * MIB, grown  # the reader kept the log from starting over
        assert await events_count(reader) == before  # and still sees its snapshot

    # No more writes: the store's own periodic checkpoint has to shrink the file.
    deadline = time.monotonic() + 30  # generous: it runs every 2 s
    while wal_size(settings) > 1 * MIB and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert wal_size(settings) <= 1 * MIB, f"WAL still {wal_size(settings)} bytes (was {grown})"
    async with store.read() as conn:
        assert await events_count(conn) == seq  # nothing lost
