"""Budget reservations in the store, on both backends (issue 22): concurrent reservations never
pass a hard stop, settling is idempotent, a month that ended starts over, and a delivery that
died is charged what it held."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from bullpen.domain.budgets import BudgetPeriod, period_start
from bullpen.store import budgets as budget_store
from bullpen.store.base import Store
from bullpen.store.tables import budget_reservations, cost_events, runs
from tests.support.seed import NOW, new_task, workspace_with_agent

LATER = NOW + timedelta(hours=1)


async def a_budget(store: Store, ws: uuid.UUID, **values: Any) -> uuid.UUID:
    row = {
        "workspace_id": ws,
        "scope": "workspace",
        "amount_usd": 1.0,
        "period": "month",
        "timezone": "UTC",
        "warn_percent": 50,
        "hard_stop": True,
        "period_start": period_start(BudgetPeriod.MONTH, "UTC", NOW),
        "created_at": NOW,
        "updated_at": NOW,
        **values,
    }
    async with store.write() as conn:
        return (await budget_store.insert(conn, row)).id


async def reserve(
    store: Store, ws: uuid.UUID, budget: uuid.UUID, want: float, **extra: Any
) -> tuple[uuid.UUID | None, float]:
    async with store.write() as conn:
        reservation, grant = await budget_store.reserve(
            conn,
            workspace_id=ws,
            budget_ids=[budget],
            want_usd=want,
            now=extra.pop("now", NOW),
            expires_at=LATER,
            **extra,
        )
    return reservation, grant.granted_usd


async def figures(store: Store, ws: uuid.UUID, budget: uuid.UUID) -> tuple[float, float]:
    async with store.read() as conn:
        found = await budget_store.get(conn, ws, budget)
    assert found is not None
    return found.spent_usd, found.reserved_usd


async def test_concurrent_reservations_never_pass_a_hard_stop(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0)
    # 40 reservations of 0.07 at once: 14 whole ones fit, one gets the last 0.02.
    results = await asyncio.gather(*(reserve(store, ws, budget, 0.07) for _ in range(40)))
    granted = sorted(g for _, g in results)
    assert sum(granted) == pytest.approx(1.0)
    assert granted.count(0.0) == 40 - 15
    assert [g for g in granted if 0 < g < 0.07] == [pytest.approx(0.02)]
    spent, reserved = await figures(store, ws, budget)
    assert (spent, reserved) == (0.0, pytest.approx(1.0))


async def test_settling_moves_the_real_cost_into_spend_once(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0, warn_percent=None)
    reservation, granted = await reserve(store, ws, budget, 0.3)
    assert reservation is not None and granted == pytest.approx(0.3)
    async with store.write() as conn:
        assert await budget_store.settle(conn, reservation, 0.12, LATER) == []
    assert await figures(store, ws, budget) == (pytest.approx(0.12), pytest.approx(0.0))
    async with store.write() as conn:  # a second settle of the same call changes nothing
        assert await budget_store.settle(conn, reservation, 0.12, LATER) is None
    assert await figures(store, ws, budget) == (pytest.approx(0.12), pytest.approx(0.0))


async def test_a_budget_without_a_hard_stop_grants_everything_and_warns_once(
    store: Store,
) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=0.1, hard_stop=False, warn_percent=50)
    async with store.write() as conn:
        _, first = await budget_store.reserve(
            conn, workspace_id=ws, budget_ids=[budget], want_usd=0.08, now=NOW, expires_at=LATER
        )
        _, second = await budget_store.reserve(
            conn, workspace_id=ws, budget_ids=[budget], want_usd=0.08, now=NOW, expires_at=LATER
        )
    assert first.granted_usd == second.granted_usd == pytest.approx(0.08)
    assert [c.kind for c in first.crossings] == ["warning"]
    assert second.crossings == []


async def test_a_month_that_has_ended_starts_over(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=0.5)
    reservation, _ = await reserve(store, ws, budget, 0.5)
    assert reservation is not None
    async with store.write() as conn:
        await budget_store.settle(conn, reservation, 0.5, NOW)
    assert (await reserve(store, ws, budget, 0.1))[1] == 0.0  # this month is spent
    next_month = NOW + timedelta(days=40)
    _, granted = await reserve(store, ws, budget, 0.1, now=next_month)
    assert granted == pytest.approx(0.1)
    async with store.read() as conn:
        found = await budget_store.get(conn, ws, budget)
    assert found is not None
    assert found.period_start == period_start(BudgetPeriod.MONTH, "UTC", next_month)
    assert found.spent_usd == 0.0 and not found.exceeded


async def test_a_dead_delivery_is_charged_what_it_held_and_only_once(store: Store) -> None:
    ws, agent = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0)
    task_id, run_id = await new_task(store, ws, agent)
    reservation, granted = await reserve(store, ws, budget, 0.2, run_id=run_id)
    assert reservation is not None and granted == pytest.approx(0.2)
    for _ in range(2):  # the reaper, then a late final write of the same delivery
        async with store.write() as conn:
            await budget_store.charge_held(conn, [run_id], LATER)
    async with store.write() as conn:
        await budget_store.settle_run(
            conn,
            run_id=run_id,
            workspace_id=ws,
            agent_id=agent,
            task_id=task_id,
            calls=[
                {
                    "reservation_id": reservation,
                    "served": True,
                    "cost_usd": 0.05,
                    "provider": "p",
                    "model": "m",
                    "input_tokens": 1,
                    "cached_input_tokens": 0,
                    "output_tokens": 1,
                    "estimated": False,
                }
            ],
            now=LATER,
        )
    async with store.read() as conn:
        ledger = list(await conn.execute(sa.select(cost_events)))
        left = list(await conn.execute(sa.select(budget_reservations)))
        run = (await conn.execute(sa.select(runs).where(runs.c.id == run_id))).one()
    assert [(r.cost_usd, r.estimated, r.provider, r.task_id) for r in ledger] == [
        (pytest.approx(0.2), True, budget_store.UNKNOWN, task_id)
    ]
    assert left == []
    assert run.id == run_id
    assert await figures(store, ws, budget) == (pytest.approx(0.2), pytest.approx(0.0))
