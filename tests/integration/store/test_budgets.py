"""Budget reservations in the store, on both backends (issue 22): concurrent reservations never
pass a hard stop, settling is idempotent, a month that ended starts over, and a delivery that
died is charged what it held; relay pools settle their calls' draws and, left by a dead
process, are charged what they held."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from bullpen.domain.budgets import BudgetPeriod, period_start
from bullpen.store import budgets as budget_store
from bullpen.store import identity
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
        assert await budget_store.settle(conn, reservation, [budget], 0.12, LATER) == []
    assert await figures(store, ws, budget) == (pytest.approx(0.12), pytest.approx(0.0))
    async with store.write() as conn:  # a second settle of the same call changes nothing
        assert await budget_store.settle(conn, reservation, [budget], 0.12, LATER) is None
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
        await budget_store.settle(conn, reservation, [budget], 0.5, NOW)
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
                    "budget_ids": [budget],
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


async def test_a_pool_takes_at_most_a_quarter_of_what_is_left_beyond_its_need(
    store: Store,
) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0)
    _, plenty = await reserve(store, ws, budget, 0.2, need_usd=0.01)
    assert plenty == pytest.approx(0.2)  # 0.2 is within a quarter of the 1.0 left
    _, stocked = await reserve(store, ws, budget, 0.5, need_usd=0.01)
    assert stocked == pytest.approx(0.2)  # a quarter of the 0.8 left
    _, needed = await reserve(store, ws, budget, 0.7, need_usd=0.5)
    assert needed == pytest.approx(0.5)  # what the calls need, though more than a quarter


async def test_draws_settle_their_cost_and_leave_the_rest_in_the_pool(store: Store) -> None:
    ws, _ = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0, warn_percent=None)
    pool, granted = await reserve(store, ws, budget, 0.4)
    assert pool is not None and granted == pytest.approx(0.4)
    draws = [
        budget_store.Draw(ws, pool, (budget,), drawn_usd=0.1, cost_usd=0.03),
        # a call that overshot what it drew: the excess goes straight to the spend
        budget_store.Draw(ws, pool, (budget,), drawn_usd=0.05, cost_usd=0.08),
    ]
    async with store.write() as conn:
        await budget_store.settle_draws(conn, draws, LATER)
    assert await figures(store, ws, budget) == (pytest.approx(0.11), pytest.approx(0.4 - 0.08))
    async with store.read() as conn:
        held = (await conn.execute(sa.select(budget_reservations.c.amount_usd))).scalar_one()
    assert held == pytest.approx(0.4 - 0.08)
    # The process gave its pool back before a late batch: that batch only adds its cost.
    async with store.write() as conn:
        await budget_store.settle(conn, pool, [budget], 0.0, LATER)
        await budget_store.settle_draws(
            conn, [budget_store.Draw(ws, pool, (budget,), drawn_usd=0.1, cost_usd=0.02)], LATER
        )
    assert await figures(store, ws, budget) == (pytest.approx(0.13), pytest.approx(0.0))


async def test_a_pool_left_by_a_dead_process_is_charged_once_when_it_expires(
    store: Store,
) -> None:
    ws, agent = await workspace_with_agent(store)
    budget = await a_budget(store, ws, amount_usd=1.0)
    async with store.write() as conn:
        key_id = await identity.create_api_key(
            conn,
            workspace_id=ws,
            user_id=None,
            agent_id=agent,
            name="k",
            prefix="bp_x",
            digest=bytes(32),
            scopes=[],
            now=NOW,
        )
    pool, _ = await reserve(store, ws, budget, 0.3, api_key_id=key_id)
    live, _ = await reserve(store, ws, budget, 0.1)
    async with store.write() as conn:  # the live one renews its expiry
        await budget_store.renew(conn, live, LATER + timedelta(hours=1))
    for _ in range(2):
        async with store.write() as conn:
            charged = await budget_store.charge_expired(conn, LATER + timedelta(seconds=1))
    assert charged == 0  # the second sweep found nothing more
    async with store.read() as conn:
        ledger = list(await conn.execute(sa.select(cost_events)))
        left = [r.id for r in await conn.execute(sa.select(budget_reservations))]
    assert [(r.cost_usd, r.estimated, r.source, r.api_key_id) for r in ledger] == [
        (pytest.approx(0.3), True, "relay", key_id)
    ]
    assert left == [live] and pool not in left
    assert await figures(store, ws, budget) == (pytest.approx(0.3), pytest.approx(0.1))
