"""Breakers pause runaway agents, on both backends over a real socket.

A loop of two `llm` agents that wake each other (a lead delegating to its report again and
again, woken each time the report ends) is stopped by the run-rate breaker; the failure and
spend breakers are checked one by one; the demo agent under a demo-like load never trips.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.app import utcnow
from bullpen.store.gateway import record_costs
from bullpen.store.tables import runs, task_changes, tasks
from tests.support.db import audits, key_reads, rows
from tests.support.http import problem_of
from tests.support.servers import RunningServer
from tests.support.team import create_task, delegate, make_agent, until_ended


async def _agent(http: aiohttp.ClientSession, server: RunningServer, agent_id: str) -> Any:
    async with http.get(f"{server.base_url}/api/v1/agents/{agent_id}", headers=server.auth) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def _patch(
    http: aiohttp.ClientSession, server: RunningServer, agent_id: str, body: dict[str, Any]
) -> Any:
    url = f"{server.base_url}/api/v1/agents/{agent_id}"
    async with http.patch(url, json=body, headers=server.auth) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _until_paused(
    http: aiohttp.ClientSession, server: RunningServer, agent_id: str, timeout: float = 30.0
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent = await _agent(http, server, agent_id)
        if agent["status"] == "paused":
            return agent
        await asyncio.sleep(0.05)
    raise AssertionError(f"agent {agent_id} was not paused within {timeout} s")


async def _runs_of_agent(server: RunningServer, agent_id: str) -> list[Any]:
    return await rows(
        server,
        sa.select(runs).where(runs.c.agent_id == UUID(agent_id)).order_by(runs.c.queued_at),
    )


async def _trips(server: RunningServer, agent_id: str) -> list[Any]:
    return [e for e in await audits(server, "agent.breaker_trip") if str(e.target_id) == agent_id]


async def test_a_loop_of_two_agents_waking_each_other_is_paused_by_the_breaker(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # The lead delegates to its report and waits; the report's end wakes the lead, which
    # delegates again (a new prompt each round, so the loop detector does not see it), and so
    # on: without a breaker this never ends.
    rounds = [{"tool_calls": [delegate("echo", f"round {i}")]} for i in range(200)]
    lead = await make_agent(http, server, "lead", rounds, max_steps=1000, loop_repeats=1000)
    echo = await make_agent(http, server, "echo", reports_to=lead["id"])
    lead = await _patch(http, server, lead["id"], {"breakers": {"runs_per_hour": 5}})
    assert lead["breakers"] == {"runs_per_hour": 5}
    assert lead["breaker_limits"]["runs_per_hour"] == 5

    task = await create_task(http, server, lead, "Loop forever")
    paused = await _until_paused(http, server, lead["id"])

    assert paused["paused_reason"].startswith("runs_per_hour:"), paused
    # Five runs of the lead started; the sixth was handed back to the queue, unstarted.
    lead_runs = await _runs_of_agent(server, lead["id"])
    assert [r.status for r in lead_runs[:5]] == ["done"] * 5
    assert [(r.status, r.started_at) for r in lead_runs[5:]] == [("queued", None)]
    trips = await _trips(server, lead["id"])
    assert len(trips) == 1
    trip = trips[0]
    assert trip.actor_type == "system" and trip.actor_id is None
    assert trip.workspace_id == server.boot.workspace_id
    assert trip.data["breaker"] == "runs_per_hour" and trip.data["limit"] == 5
    assert trip.data["after"] == {"status": "paused", "paused_reason": paused["paused_reason"]}
    # ... and on the workspace stream, in the same transaction.
    [notice] = await rows(
        server, sa.select(task_changes.c.data).where(task_changes.c.kind == "agent.paused")
    )
    assert notice.data["agent_id"] == lead["id"] and notice.data["breaker"] == "runs_per_hour"

    # The loop has stopped: nothing of either agent runs any more.
    await asyncio.sleep(0.5)
    before = [(r.id, r.status) for r in await _runs_of_agent(server, echo["id"])]
    await asyncio.sleep(0.5)
    assert [(r.id, r.status) for r in await _runs_of_agent(server, echo["id"])] == before
    assert all(status == "done" for _, status in before) and len(before) == 5
    assert len(await _runs_of_agent(server, lead["id"])) == 6

    # Resuming clears the reason and starts a fresh window: five more runs, then paused again.
    async with http.post(
        f"{server.base_url}/api/v1/agents/{lead['id']}/resume", headers=server.auth
    ) as resp:
        resumed = await resp.json()
    assert resumed["status"] == "active" and resumed["paused_reason"] is None
    again = await _until_paused(http, server, lead["id"])
    assert again["paused_reason"].startswith("runs_per_hour:")
    lead_runs = await _runs_of_agent(server, lead["id"])
    assert [r.status for r in lead_runs].count("done") == 10
    assert len(await _trips(server, lead["id"])) == 2
    resumes = [e for e in await audits(server, "agent.resume") if str(e.target_id) == lead["id"]]
    assert resumes[0].data["before"]["paused_reason"] == paused["paused_reason"]
    assert resumes[0].data["after"]["paused_reason"] is None
    task_row = (await rows(server, sa.select(tasks).where(tasks.c.id == UUID(task["id"]))))[0]
    assert task_row.status in ("queued", "blocked")


@pytest.mark.with_settings(sim_tokens_per_second=100.0)
async def test_runs_per_hour_lets_the_limit_start_and_the_rest_wait_for_a_resume(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # One run at a time, each ~0.25 s: all five tasks are queued before the fourth would start
    # (a paused agent takes no new tasks).
    agent = await make_agent(http, server, "busy", max_concurrent_runs=1)
    await _patch(http, server, agent["id"], {"breakers": {"runs_per_hour": 3}})
    created = await asyncio.gather(
        *(create_task(http, server, agent, f"A job to do, number {i}") for i in range(5))
    )
    paused = await _until_paused(http, server, agent["id"])
    assert paused["paused_reason"].startswith("runs_per_hour:")
    await asyncio.sleep(0.3)
    statuses = sorted(r.status for r in await _runs_of_agent(server, agent["id"]))
    assert statuses.count("queued") == 2 and len(statuses) == 5, statuses
    assert statuses.count("done") + statuses.count("running") == 3

    resumed = await _patch(http, server, agent["id"], {"status": "active"})  # PATCH resumes too
    assert resumed["paused_reason"] is None
    (update,) = [e for e in await audits(server, "agent.update") if e.data["after"].get("status")]
    assert update.data["before"] == {"status": "paused", "paused_reason": paused["paused_reason"]}
    assert update.data["after"] == {"status": "active", "paused_reason": None}
    for task in created:
        assert (await until_ended(http, server, task["id"]))["status"] == "done"
    assert (await _agent(http, server, agent["id"]))["status"] == "active"


async def test_failures_in_a_row_pause_and_a_success_starts_the_count_again(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await make_agent(http, server, "flaky", model="no-such-model")
    await _patch(http, server, agent["id"], {"breakers": {"failures_in_a_row": 3}})
    for i in range(2):
        task = await create_task(http, server, agent, f"This one fails, {i}")
        assert (await until_ended(http, server, task["id"]))["status"] == "failed"
    # A success between failures starts the count again.
    await _patch(http, server, agent["id"], {"config": {"provider": "simulated", "model": "sim-1"}})
    task = await create_task(http, server, agent, "This one succeeds")
    assert (await until_ended(http, server, task["id"]))["status"] == "done"
    await _patch(
        http, server, agent["id"], {"config": {"provider": "simulated", "model": "no-such-model"}}
    )
    for i in range(2):
        task = await create_task(http, server, agent, f"This fails again, {i}")
        assert (await until_ended(http, server, task["id"]))["status"] == "failed"
    assert (await _agent(http, server, agent["id"]))["status"] == "active"
    task = await create_task(http, server, agent, "the third in a row")
    assert (await until_ended(http, server, task["id"]))["status"] == "failed"
    paused = await _until_paused(http, server, agent["id"])
    assert paused["paused_reason"] == "failures_in_a_row: 3 runs in a row failed (limit 3)"
    (trip,) = await _trips(server, agent["id"])
    assert trip.actor_type == "system" and trip.data["observed"] == 3


async def test_spend_per_hour_counts_the_last_hour_of_the_ledger_since_the_last_resume(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await make_agent(http, server, "spender")
    await _patch(http, server, agent["id"], {"breakers": {"usd_per_hour": 1.0}})
    agent_id = UUID(agent["id"])

    async def spend(usd: float, ago: timedelta) -> None:
        row = {
            "workspace_id": server.boot.workspace_id,
            "run_id": None,
            "agent_id": agent_id,
            "user_id": None,
            "api_key_id": None,
            "provider": "priced",
            "model": "m",
            "input_tokens": 100,
            "cached_input_tokens": 0,
            "output_tokens": 100,
            "cost_usd": usd,
            "created_at": utcnow() - ago,
        }
        async with server.services.store.write() as conn:
            await record_costs(conn, [row])

    async def one_run() -> None:
        task = await create_task(http, server, agent, "Spend some money")
        assert (await until_ended(http, server, task["id"]))["status"] == "done"

    await spend(100.0, timedelta(hours=2))  # outside the window
    await spend(0.6, timedelta(minutes=30))
    await one_run()
    assert (await _agent(http, server, agent["id"]))["status"] == "active"

    await spend(0.5, timedelta(minutes=1))  # $1.10 within the hour
    await one_run()
    paused = await _until_paused(http, server, agent["id"])
    assert paused["paused_reason"].startswith("usd_per_hour: the agent spent $1.1000")
    (trip,) = await _trips(server, agent["id"])
    assert trip.data["breaker"] == "usd_per_hour" and trip.data["observed"] == pytest.approx(1.1)

    # A resume starts a fresh window: what was spent before it no longer counts.
    await _patch(http, server, agent["id"], {"status": "active"})
    await one_run()
    assert (await _agent(http, server, agent["id"]))["status"] == "active"


@pytest.mark.with_settings(
    breaker_runs_per_hour=20, rate_limit_key_rps=10_000.0, rate_limit_workspace_rps=10_000.0
)
async def test_the_demo_agent_under_a_steady_demo_load_never_trips(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    demo = await _agent(http, server, str(server.boot.agent_id))
    # Its overrides keep the run-rate breaker off (the reference scenario's 80 users start
    # ~30 runs a second); failures and spend keep the instance's defaults.
    assert demo["breakers"] == {"runs_per_hour": None}
    assert demo["breaker_limits"] == {
        "runs_per_hour": None,
        "failures_in_a_row": 10,
        "usd_per_hour": 20.0,
    }
    # Users that each create a task, watch it to its end, and create the next: far more runs
    # than the instance default of this test (20 an hour) allows any other agent.
    users, per_user = 10, 8

    async def user(n: int) -> None:
        for i in range(per_user):
            task = await create_task(http, server, demo, f"Analyze dataset {n}-{i}")
            assert (await until_ended(http, server, task["id"]))["status"] == "done"

    await asyncio.gather(*(user(n) for n in range(users)))
    after = await _agent(http, server, demo["id"])
    assert after["status"] == "active" and after["paused_reason"] is None
    assert await _trips(server, demo["id"]) == []
    assert len(await _runs_of_agent(server, demo["id"])) == users * per_user


@pytest.mark.with_settings(breaker_failures_in_a_row=4, breaker_usd_per_hour=0)
async def test_breaker_overrides_are_validated_and_defaults_come_from_settings(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await make_agent(http, server, "limited")
    assert agent["breakers"] == {} and agent["paused_reason"] is None
    assert agent["breaker_limits"] == {
        "runs_per_hour": 1000,
        "failures_in_a_row": 4,
        "usd_per_hour": None,
    }
    url = f"{server.base_url}/api/v1/agents/{agent['id']}"
    for bad in (
        {"runs_per_hour": 0},
        {"runs_per_hour": 1.5},
        {"runs_per_hour": "10"},
        {"failures_in_a_row": -1},
        {"usd_per_hour": 0},
        {"usd_per_hour": "NaN"},
        {"usd_per_hour": 1e12},
        {"Spend some money": 1},
    ):
        async with http.patch(url, json={"breakers": bad}, headers=server.auth) as resp:
            problem = await problem_of(resp, 422)
        assert problem["type"].endswith("validation-error") or problem["status"] == 422, problem
    async with http.patch(url, json={"breakers": None}, headers=server.auth) as resp:
        await problem_of(resp, 422)
    changed = await _patch(
        http, server, agent["id"], {"breakers": {"runs_per_hour": None, "usd_per_hour": 2.5}}
    )
    assert changed["breakers"] == {"runs_per_hour": None, "usd_per_hour": 2.5}
    assert changed["breaker_limits"] == {
        "runs_per_hour": None,
        "failures_in_a_row": 4,
        "usd_per_hour": 2.5,
    }
    (update,) = [e for e in await audits(server, "agent.update") if str(e.target_id) == agent["id"]]
    assert update.data["after"]["breakers"] == {"runs_per_hour": None, "usd_per_hour": 2.5}
    cleared = await _patch(http, server, agent["id"], {"breakers": {}})
    assert cleared["breakers"] == {} and cleared["breaker_limits"]["runs_per_hour"] == 1000
    # On create too.
    body = {
        "name": "capped",
        "config": {"provider": "simulated", "model": "sim-1"},
        "breakers": {"failures_in_a_row": 2},
    }
    async with http.post(
        f"{server.base_url}/api/v1/agents", json=body, headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()
        assert (await resp.json())["breaker_limits"]["failures_in_a_row"] == 2
    body = {**body, "name": "bad", "breakers": {"failures_in_a_row": 0}}
    async with http.post(
        f"{server.base_url}/api/v1/agents", json=body, headers=server.auth
    ) as resp:
        await problem_of(resp, 422)


async def test_run_ends_keep_the_api_key_cached(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """A run's end writes its agent's failures in a row (the agents table is one of an API
    key's sources): that must not empty the key cache, or every request reads its key again."""
    flaky = await make_agent(http, server, "flaky", model="no-such-model")
    task = await create_task(http, server, flaky, "This one fails first")
    assert (await until_ended(http, server, task["id"]))["status"] == "failed"
    await _patch(http, server, flaky["id"], {"config": {"provider": "simulated", "model": "sim-1"}})
    with key_reads(server) as lookups:
        for i in range(3):  # the first resets the failures in a row, the others find none
            task = await create_task(http, server, flaky, f"This one succeeds, {i}")
            assert (await until_ended(http, server, task["id"]))["status"] == "done"
            for _ in range(3):
                await _agent(http, server, flaky["id"])
    # The first request reads the key and records its use (read again by the next one); the
    # reset of the failures empties nothing.
    assert len(lookups) <= 2, lookups
