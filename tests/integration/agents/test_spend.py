"""Spend while tokens stream, on both backends: a run's cost ceiling and the workspace's budgets
are reserved before a call and in slices while it streams, and stop it at the cap; the ledger
gets one row per call, settled with its real usage (issue 22)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.store.tables import (
    budget_reservations,
    budgets,
    cost_events,
    run_events,
    task_changes,
    tasks,
)
from tests.support.db import audits, rows
from tests.support.http import call, problem
from tests.support.servers import RunningServer
from tests.support.spend import USD_PER_TOKEN, make_budget, priced_provider
from tests.support.team import create_task, get_task, make_agent, runs_of, until_ended

SLICE = 16  # output tokens a call reserves at a time in these tests
ANSWER = 200  # tokens the simulator answers with

pytestmark = pytest.mark.with_settings(
    budget_slice_tokens=SLICE, sim_response_tokens=ANSWER, sim_tokens_per_second=100.0
)


async def ledger(server: RunningServer, task_id: str) -> list[Any]:
    return await rows(server, sa.select(cost_events).where(cost_events.c.task_id == UUID(task_id)))


async def texts(server: RunningServer, task_id: str) -> str:
    found = await rows(
        server,
        sa.select(run_events.c.data)
        .where(run_events.c.task_id == UUID(task_id), run_events.c.kind == "text")
        .order_by(run_events.c.seq),
    )
    return "".join(r.data["text"] for r in found)


async def open_reservations(server: RunningServer) -> int:
    return len(await rows(server, sa.select(budget_reservations.c.id)))


async def test_a_ceiling_the_prompt_alone_would_pass_refuses_the_call_before_it_starts(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    agent = await make_agent(http, server, "capped", provider="priced", max_cost_usd=0.001)
    task = await create_task(http, server, agent, "A prompt that costs more than the cap")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "failed"
    assert ended["run"]["error_code"] == "budget-exceeded", ended
    assert "no room left for this call" in ended["error"]
    assert await ledger(server, task["id"]) == []
    assert server.services.simulator is not None
    assert server.services.simulator.requests["sim-1"] == 0  # the provider was never asked


async def test_a_ceiling_stops_the_stream_keeps_the_partial_text_and_holds_across_retries(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    cap = 0.05  # the prompt (about 20 tokens) and about 30 tokens of the answer
    agent = await make_agent(http, server, "capped", provider="priced", max_cost_usd=cap)
    task = await create_task(http, server, agent, "Write at length")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "failed"
    assert ended["run"]["error_code"] == "budget-exceeded", ended
    assert "stopped the answer" in ended["error"]
    partial = await texts(server, task["id"])
    assert partial, "the text streamed before the stop is kept"
    first = await ledger(server, task["id"])
    assert len(first) == 1 and first[0].estimated and first[0].source == "run"
    spent = first[0].cost_usd
    # Stopped within one slice of the cap, never at the full answer.
    assert cap - SLICE * USD_PER_TOKEN < spent <= cap + SLICE * USD_PER_TOKEN, spent
    assert first[0].output_tokens < ANSWER / 2
    assert await open_reservations(server) == 0

    # A retry is the same task: its ceiling counts what the first run spent.
    async with http.post(
        f"{server.base_url}/api/v1/tasks/{task['id']}/retry", headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()
    again = await until_ended(http, server, task["id"])
    assert again["status"] == "failed"
    assert again["run"]["error_code"] in ("agent-limit", "budget-exceeded"), again
    total = sum(r.cost_usd for r in await ledger(server, task["id"]))
    assert total <= cap + SLICE * USD_PER_TOKEN
    assert len(await runs_of(server, task["id"])) == 2


async def test_a_run_under_its_ceiling_settles_its_real_usage(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    agent = await make_agent(http, server, "roomy", provider="priced", max_cost_usd=10.0)
    task = await create_task(http, server, agent, "A short answer")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done", ended
    [row] = await ledger(server, task["id"])
    # The provider's own usage chunk, not an estimate.
    assert not row.estimated and row.output_tokens == ANSWER
    assert row.cost_usd == pytest.approx((row.input_tokens + ANSWER) * USD_PER_TOKEN)
    assert ended["run"]["cost_usd"] == pytest.approx(row.cost_usd)


async def test_concurrent_runs_never_spend_past_a_budget_by_more_than_a_slice_each(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    agent = await make_agent(http, server, "crowd", provider="priced", max_concurrent_runs=50)
    cap = 0.5  # about two whole answers; 30 tasks want fifteen times that
    budget = await make_budget(
        http, server, scope="agent", agent_id=agent["id"], amount_usd=cap, warn_percent=50
    )
    created = await asyncio.gather(
        *(create_task(http, server, agent, f"Answer number {i}") for i in range(30))
    )
    ended = [await until_ended(http, server, t["id"], 60) for t in created]  # one poller
    codes = [t["run"]["error_code"] for t in ended if t["status"] == "failed"]
    assert codes and set(codes) == {"budget-exceeded"}, codes

    spent = await rows(server, sa.select(cost_events))
    total = sum(r.cost_usd for r in spent)
    in_flight = 30  # every run may have been streaming when the cap was reached
    assert total <= cap + in_flight * SLICE * USD_PER_TOKEN, [
        (r.input_tokens, r.output_tokens, r.estimated, r.cost_usd) for r in spent
    ]
    # Calls are refused while those in flight hold the rest: the budget is used, not passed.
    assert total > SLICE * USD_PER_TOKEN
    [after] = await rows(server, sa.select(budgets).where(budgets.c.id == UUID(budget["id"])))
    assert after.spent_usd == pytest.approx(total)  # the budget and the ledger agree
    assert after.reserved_usd == pytest.approx(0.0, abs=1e-9)
    assert after.warned and after.exceeded
    assert await open_reservations(server) == 0
    actions = [
        r.action
        for r in await rows(
            server,
            sa.text("SELECT action FROM audit_events WHERE target_id = :b").bindparams(
                b=UUID(budget["id"])
            ),
        )
    ]
    assert "budget.warning" in actions and "budget.exceeded" in actions
    notices = await rows(
        server,
        sa.select(task_changes.c.kind, task_changes.c.data).where(
            task_changes.c.kind.like("budget.%")
        ),
    )
    assert sorted(n.kind for n in notices) == ["budget.exceeded", "budget.warning"]
    assert all(n.data["budget_id"] == budget["id"] for n in notices)


async def test_runs_a_budget_stops_do_not_trip_the_failure_breaker(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    agent = await make_agent(http, server, "thrifty", provider="priced", max_cost_usd=0.001)
    async with http.patch(
        f"{server.base_url}/api/v1/agents/{agent['id']}",
        json={"breakers": {"failures_in_a_row": 2}},
        headers=server.auth,
    ) as resp:
        assert resp.status == 200, await resp.text()
    for n in range(3):
        task = await create_task(http, server, agent, f"Too dear, take {n}")
        ended = await until_ended(http, server, task["id"])
        assert ended["run"]["error_code"] == "budget-exceeded"
    async with http.get(
        f"{server.base_url}/api/v1/agents/{agent['id']}", headers=server.auth
    ) as resp:
        after = await resp.json()
    assert after["status"] == "active" and after["paused_reason"] is None


async def test_an_approver_lets_a_task_a_budget_stopped_go_on_with_a_one_off_override(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    agent = await make_agent(http, server, "thrifty", provider="priced")
    cap = 0.1  # the prompt and about 80 tokens of a 200-token answer
    await make_budget(http, server, scope="agent", agent_id=agent["id"], amount_usd=cap)
    stopped = []
    for prompt in ("Write at length", "Write at length again"):
        task = await create_task(http, server, agent, prompt)
        ended = await until_ended(http, server, task["id"])
        assert ended["run"]["error_code"] == "budget-exceeded", ended
        stopped.append(task["id"])
    pending = await call(http, server, "GET", "/api/v1/approvals?status=pending")
    overrides = {a["task_id"]: a for a in pending.body["items"]}
    assert set(overrides) == set(stopped)
    assert {a["kind"] for a in overrides.values()} == {"budget_override"}
    first, second = (overrides[t]["id"] for t in stopped)

    url = f"/api/v1/approvals/{first}"
    problem(await call(http, server, "POST", url + "/approve", body={}), 422)  # how much?
    problem(await call(http, server, "POST", url + "/deny", body={"amount_usd": 1}), 422)
    problem(await call(http, server, "POST", url + "/approve", body={"amount_usd": 0}), 422)
    approved = await call(
        http, server, "POST", url + "/approve", body={"amount_usd": 0.5, "reason": "worth it"}
    )
    assert approved.status == 200 and approved.body["status"] == "approved", approved.text
    done = await until_ended(http, server, stopped[0])
    assert done["status"] == "done", done  # the override let the whole answer through
    spent = sum(r.cost_usd for r in await ledger(server, stopped[0]))
    assert cap < spent <= cap + 0.5 + SLICE * USD_PER_TOKEN
    [left] = await rows(
        server, sa.select(tasks.c.budget_override_usd).where(tasks.c.id == UUID(stopped[0]))
    )
    assert 0 <= left.budget_override_usd < 0.5  # what the task used is gone from it
    (audited,) = await audits(server, "approval.approve")
    assert audited.data["amount_usd"] == 0.5 and audited.data["queued"] is True

    # Another kind of approval takes no amount; a denied override leaves its task failed.
    denied = await call(http, server, "POST", f"/api/v1/approvals/{second}/deny", body={})
    assert denied.status == 200 and denied.body["status"] == "denied"
    await asyncio.sleep(0.3)
    assert len(await runs_of(server, stopped[1])) == 1
    assert (await get_task(http, server, stopped[1]))["status"] == "failed"
