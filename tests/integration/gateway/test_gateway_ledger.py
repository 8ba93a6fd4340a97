"""The usage ledger: group commits that never hold a caller back longer than one commit."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from bullpen.app import open_store, utcnow
from bullpen.services.ledger import UsageLedger
from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.tables import cost_events
from tests.support.gate import Gate, moved
from tests.support.seed import NOW, workspace_with_agent
from tests.support.servers import RunningServer

SOON_S = 10.0


def row(workspace_id: Any, n: int) -> dict[str, Any]:
    return {
        "workspace_id": workspace_id,
        "run_id": None,
        "agent_id": None,
        "user_id": None,
        "api_key_id": None,
        "provider": "p",
        "model": "m",
        "input_tokens": n,
        "cached_input_tokens": 0,
        "output_tokens": n,
        "cost_usd": n / 1e6,
        "created_at": NOW,
    }


async def test_rows_arriving_during_a_commit_are_committed_next_not_later(store: Store) -> None:
    ws, _agent = await workspace_with_agent(store)
    async with UsageLedger(store, utcnow) as ledger:
        started = time.monotonic()
        waits = []
        for burst in range(20):  # each burst lands while the previous one commits
            waits += [ledger.record(row(ws, burst * 10 + i)) for i in range(10)]
            await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*waits), 5)
        elapsed = time.monotonic() - started
    async with store.read() as conn:
        stored = (await conn.execute(sa.select(sa.func.count()).select_from(cost_events))).scalar()
    assert stored == 200 and ledger.written == 200
    assert elapsed < 0.5, f"200 rows took {elapsed:.2f} s: a caller waited past its commit"


@pytest.mark.parametrize("linger_s", [0.0, 0.3])
async def test_rows_of_calls_ending_within_the_linger_commit_together(
    store: Store, linger_s: float
) -> None:
    ws, _agent = await workspace_with_agent(store)
    async with UsageLedger(store, utcnow, linger_s=linger_s) as ledger:
        started = time.monotonic()
        committed: list[float] = []
        first = ledger.record(row(ws, 0))
        first.add_done_callback(lambda _: committed.append(time.monotonic() - started))
        for i in range(1, 10):  # a row every 10 ms: 90 ms in all, within one linger
            await asyncio.sleep(0.01)
            ledger.record(row(ws, i))
        await asyncio.wait_for(first, SOON_S)
        [waited] = committed
        async with asyncio.timeout(SOON_S):
            while ledger.written < 10:
                await asyncio.sleep(0.01)
    assert await _stored(store) == list(range(10))
    if linger_s:
        assert ledger.batches == 1, ledger.batches
        assert linger_s <= waited < linger_s + 0.5, waited  # the first waited for the rest
    else:
        assert ledger.batches >= 5, ledger.batches  # each went out about as it came
        assert waited < 0.1, waited


@pytest.mark.with_settings(ledger_linger_ms=300)
async def test_the_apps_ledger_lingers_as_configured(server: RunningServer) -> None:
    ledger = server.services.ledger
    started = time.monotonic()
    await asyncio.wait_for(ledger.record(row(server.boot.workspace_id, 1)), SOON_S)
    assert 0.3 <= time.monotonic() - started < 0.8


@pytest.mark.parametrize("linger_ms", [-1, 1001])
def test_a_linger_out_of_bounds_is_refused(linger_ms: int, tmp_path: Any) -> None:
    with pytest.raises(ValidationError, match="ledger_linger_ms"):
        Settings(data_dir=tmp_path, ledger_linger_ms=linger_ms)


async def _stored(store: Store) -> list[int]:
    async with store.read() as conn:
        found = await conn.execute(sa.select(cost_events.c.input_tokens))
    return sorted(found.scalars())


@pytest.mark.parametrize("backend", ["postgres"])  # SQLite has one writer: batches queue there
async def test_a_row_does_not_wait_behind_a_batch_that_cannot_commit_yet(store: Store) -> None:
    stuck_ws, _ = await workspace_with_agent(store, "stuck")
    other_ws, _ = await workspace_with_agent(store, "other")
    url = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    locker = await asyncpg.connect(url)
    try:
        # A row lock on one workspace holds back inserts that reference it (the foreign key
        # check), and only those.
        locking = locker.transaction()
        await locking.start()
        await locker.execute("SELECT 1 FROM workspaces WHERE id = $1 FOR UPDATE", stuck_ws)
        async with UsageLedger(store, utcnow) as ledger:
            stuck = ledger.record(row(stuck_ws, 1))
            await asyncio.sleep(0.2)  # its batch is in the database, waiting on the lock
            assert not stuck.done()
            await asyncio.wait_for(ledger.record(row(other_ws, 2)), SOON_S)
            assert await _stored(store) == [2] and not stuck.done()
            await locking.rollback()
            await asyncio.wait_for(stuck, SOON_S)
        assert await _stored(store) == [1, 2] and ledger.written == 2
    finally:
        await locker.close()


@pytest.mark.parametrize("backend", ["postgres"])  # a network outage: PostgreSQL's
async def test_rows_recorded_while_the_database_is_away_are_kept_and_committed_later(
    settings: Settings,
) -> None:
    parts = urlsplit(settings.database_url)
    assert parts.hostname is not None and parts.port is not None
    async with Gate(parts.hostname, parts.port) as gate:
        through = moved(settings.database_url, gate.port)
        async with open_store(settings.model_copy(update={"database_url": through})) as store:
            ws, _agent = await workspace_with_agent(store)
            async with UsageLedger(store, utcnow) as ledger:
                gate.cut()
                # The caller is answered although its row could not commit.
                await asyncio.wait_for(ledger.record(row(ws, 1)), SOON_S)
                assert ledger.written == 0
                gate.restore()
                await asyncio.wait_for(ledger.record(row(ws, 2)), SOON_S)
                async with asyncio.timeout(SOON_S):
                    while ledger.written < 2:  # the kept row goes again after a second
                        await asyncio.sleep(0.05)
            assert await _stored(store) == [1, 2]


async def test_rows_still_queued_when_the_ledger_closes_are_committed(store: Store) -> None:
    # The relay does not wait for its row: a graceful stop must not lose the last ones.
    ws, _agent = await workspace_with_agent(store)
    async with UsageLedger(store, utcnow) as ledger:
        for i in range(50):
            ledger.record(row(ws, i))
    assert await _stored(store) == list(range(50)) and ledger.written == 50
