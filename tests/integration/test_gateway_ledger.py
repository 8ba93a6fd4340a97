"""The usage ledger: group commits that never hold a caller back longer than one commit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import sqlalchemy as sa

from bullpen.services.gateway import UsageLedger
from bullpen.store.base import Store
from bullpen.store.tables import cost_events
from tests.integration.seed import NOW, workspace_with_agent


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
    async with UsageLedger(store) as ledger:
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
