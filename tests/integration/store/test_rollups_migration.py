"""Migration 0021 (rollups) fills `cost_days` and `ttft_hours` from the rows already there,
on both backends, and goes down and up again."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta

import sqlalchemy as sa
from alembic import command

from bullpen.store import costs, latency, rollups
from bullpen.store.base import Store
from bullpen.store.migrate import alembic_config
from bullpen.store.tables import cost_events, runs
from tests.support.seed import NOW, new_task, workspace_with_agent


async def _move(store: Store, target: str, *, down: bool = False) -> set[str]:
    def move(connection: sa.Connection) -> set[str]:
        (command.downgrade if down else command.upgrade)(alembic_config(connection), target)
        return set(sa.inspect(connection).get_table_names())

    return await store.run_sync(move)


async def test_0021_fills_the_rollups_from_the_rows_there_and_goes_down_and_up(
    bare: Store,
) -> None:
    rng = random.Random(21)
    assert not {"cost_days", "ttft_hours"} & await _move(bare, "0020")
    ws, agent = await workspace_with_agent(bare)
    ttfts: dict[str, list[float]] = {}
    ledger: dict[tuple[str, str], list[int]] = {}  # output tokens per (UTC day, model)
    for i in range(30):
        started = NOW + timedelta(minutes=rng.randint(0, 5 * 60))
        _, run_id = await new_task(bare, ws, agent, started)
        ttft = rng.choice([0.5, rng.uniform(50, 3000)]) if i % 7 else None
        async with bare.write() as conn:
            await conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(status="done", started_at=started, ttft_ms=ttft)
            )
            await conn.execute(
                cost_events.insert().values(
                    id=uuid.uuid4(),
                    workspace_id=ws,
                    run_id=run_id,
                    agent_id=agent if i % 3 else None,
                    user_id=None,
                    api_key_id=None,
                    provider="p",
                    model=(model := rng.choice(["m1", "m2"])),
                    input_tokens=i,
                    cached_input_tokens=1,
                    output_tokens=2 * i,
                    cost_usd=i / 1000,
                    created_at=(at := NOW + timedelta(hours=rng.randint(0, 71), seconds=i)),
                    source="run",
                    estimated=False,
                )
            )
        ledger.setdefault((at.date().isoformat(), model), []).append(2 * i)
        if ttft is not None:
            ttfts.setdefault(started.strftime("%Y-%m-%dT%H:00"), []).append(ttft)
    assert {"cost_days", "ttft_hours"} <= await _move(bare, "0021")
    since, until = NOW, NOW + timedelta(days=3)
    async with bare.read() as conn:
        rolled = await costs.totals(
            conn, ws, since=since, until=until, group_by="model", by_day=True
        )
        # The rollup alone answered (whole days): its rows are the ledger's sums.
        assert [(r["day"], r["key"], r["calls"], r["output_tokens"]) for r in rolled] == [
            (day, model, len(sums), sum(sums)) for (day, model), sums in sorted(ledger.items())
        ]
        hours = await latency.ttft_per_hour(conn, ws, since=NOW, until=NOW + timedelta(hours=6))
    assert [row["hour"] for row in hours] == sorted(ttfts)
    for row in hours:
        values = sorted(ttfts[row["hour"]])
        assert row["runs"] == len(values)
        middle = values[(len(values) - 1) // 2]  # p50 lies between the two middle values
        upper = values[len(values) // 2]
        low, high = (
            rollups.bucket_bounds(rollups.bucket_of(middle))[0],
            rollups.bucket_bounds(rollups.bucket_of(upper))[1],
        )
        assert low <= row["p50_ms"] <= high
    assert not {"cost_days", "ttft_hours"} & await _move(bare, "0020", down=True)
    assert {"cost_days", "ttft_hours"} <= await _move(bare, "0021")
