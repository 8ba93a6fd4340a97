"""Workflows on both backends: blockers, ceilings and the loop detector, checkout, the agent
lifecycle, and a tool loop resumed from its last step after a crash."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.agents.base import RunContext, StepResult, TaskBrief
from bullpen.agents.llm import LlmAdapter
from bullpen.domain.events import EventKind
from bullpen.domain.runs import ClaimedRun, Held, RetryPolicy
from bullpen.domain.status import RunStatus
from bullpen.errors import Conflict
from bullpen.services.team import Team
from bullpen.store import claims as claim_store
from bullpen.store import runs as run_store
from bullpen.store import tasks as task_store
from bullpen.store.tables import runs, task_comments, task_steps, tasks
from tests.support.db import rows
from tests.support.http import problem_of
from tests.support.servers import RunningServer
from tests.support.team import (
    create_task,
    delegate,
    faulty_provider,
    finish,
    get_task,
    make_agent,
    runs_of,
    until_ended,
)


def comment(body: str) -> dict[str, Any]:
    return {"name": "comment", "arguments": {"body": body}}


async def active_runs(server: RunningServer, task_id: str) -> list[Any]:
    return [
        r
        for r in await runs_of(server, task_id)
        if r.status in (RunStatus.QUEUED.value, RunStatus.RUNNING.value)
    ]


async def until_status(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str, status: str
) -> dict[str, Any]:
    async with asyncio.timeout(15):
        while True:
            task = await get_task(http, server, task_id)
            if task["status"] == status:
                return task
            await asyncio.sleep(0.05)


async def post(
    http: aiohttp.ClientSession, server: RunningServer, path: str, body: Any = None
) -> aiohttp.ClientResponse:
    async with http.post(f"{server.base_url}{path}", json=body, headers=server.auth) as resp:
        await resp.read()
        return resp


# ---- blockers ---------------------------------------------------------------------------


async def test_a_blocked_task_waits_for_its_blockers_and_sees_how_they_ended(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await faulty_provider(http, server)
    slow = await make_agent(
        http, server, "slow", [{"text": "FIRST DONE"}], provider="faulty", model="sim-1@slow:40"
    )
    broken = await make_agent(http, server, "broken", provider="faulty", model="sim-1@400")
    after = await make_agent(http, server, "after", [{"text": "AFTER SAW: {{context}}"}])
    first = await create_task(http, server, slow, "The first part")
    failing = await create_task(http, server, broken, "A part that fails")
    waiting = await create_task(
        http, server, after, "The part after", blocked_by=[first["id"], failing["id"]]
    )
    assert waiting["status"] == "blocked" and waiting["run"] is None

    ended = await until_ended(http, server, waiting["id"])
    assert ended["status"] == "done"
    assert (await get_task(http, server, first["id"]))["status"] == "done"
    assert (await get_task(http, server, failing["id"]))["status"] == "failed"
    # Its context named both blockers: the one that succeeded and the one that failed, why.
    assert "FIRST DONE" in ended["result"] and '"status":"failed"' in ended["result"]
    runs_of_waiting = await runs_of(server, waiting["id"])
    assert len(runs_of_waiting) == 1
    first_runs = await runs_of(server, first["id"])
    assert runs_of_waiting[0].queued_at >= first_runs[-1].finished_at

    # Blockers that have all ended already: the task is queued at once.
    again = await create_task(http, server, after, "Once more, after it", blocked_by=[first["id"]])
    assert again["status"] == "queued" and again["run"]["status"] == "queued"


async def test_bad_blockers_and_parents_are_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = {"id": str(server.boot.agent_id)}
    url = f"{server.base_url}/api/v1/tasks"
    body = {"prompt": "Analyze this dataset", "agent_id": agent["id"]}
    missing = "00000000-0000-4000-8000-000000000000"
    async with http.post(url, json={**body, "blocked_by": [missing]}, headers=server.auth) as r:
        await problem_of(r, 404)
    async with http.post(url, json={**body, "parent_id": missing}, headers=server.auth) as r:
        await problem_of(r, 404)
    async with http.post(
        url, json={**body, "blocked_by": [missing] * 51}, headers=server.auth
    ) as r:
        await problem_of(r, 422)
    done = await until_ended(http, server, (await create_task(http, server, agent, "x" * 12))["id"])
    async with http.post(url, json={**body, "parent_id": done["id"]}, headers=server.auth) as r:
        assert "ended" in (await problem_of(r, 409))["detail"]


# ---- ceilings and the loop detector -------------------------------------------------------


@pytest.mark.parametrize(
    ("turns", "config", "code", "words"),
    [
        (
            [{"tool_calls": [comment(f"note {i}")]} for i in range(5)],
            {"max_steps": 2},
            "agent-limit",
            "2 tool steps",
        ),
        ([{"tool_calls": [comment("same")]}] * 5, {}, "agent-loop", "3 times"),
        ([{"tool_calls": [comment("again")]}] * 5, {"loop_repeats": 2}, "agent-loop", "2 times"),
        (
            None,
            {"max_wall_s": 0.3, "provider": "faulty", "model": "sim-1@hang"},
            "agent-limit",
            "wall time",
        ),
    ],
    ids=["steps", "loop", "loop-configured", "wall-time"],
)
async def test_ceilings_and_the_loop_detector_stop_a_run(
    server: RunningServer,
    http: aiohttp.ClientSession,
    turns: list[dict[str, Any]] | None,
    config: dict[str, Any],
    code: str,
    words: str,
) -> None:
    await faulty_provider(http, server)
    agent = await make_agent(http, server, "runaway", turns, **config)
    ended = await until_ended(
        http, server, (await create_task(http, server, agent, "Go on with the work"))["id"]
    )
    assert ended["status"] == "failed"
    assert ended["run"]["error_code"] == code and words in ended["error"], (
        ended["error"],
        ended["run"],
    )
    # Nothing was left holding the task.
    assert await active_runs(server, ended["id"]) == []


async def test_ceiling_settings_are_checked(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for bad in ({"max_steps": 0}, {"max_wall_s": -1}, {"loop_repeats": 1}, {"max_cost_usd": 0}):
        body = {"name": "bad", "config": {"provider": "simulated", "model": "sim-1", **bad}}
        async with http.post(
            f"{server.base_url}/api/v1/agents", json=body, headers=server.auth
        ) as resp:
            await problem_of(resp, 422)


# ---- checkout: one active run per task, released on every terminal path ------------------


async def test_a_task_holds_at_most_one_queued_or_running_run(server: RunningServer) -> None:
    store = server.services.store
    task_id, run_id = None, None
    async with store.write() as conn:
        task, run = await task_store.insert_task_with_run(
            conn,
            workspace_id=server.boot.workspace_id,
            agent_id=server.boot.agent_id,
            title="t",
            prompt="p" * 10,
            now=server.services.clock(),
        )
        task_id, run_id = task.id, run.id
    with pytest.raises(Conflict):
        async with store.write() as conn:
            await task_store.insert_run(
                conn,
                task_id,
                server.boot.workspace_id,
                server.boot.agent_id,
                server.services.clock(),
            )
    found = await rows(server, sa.select(runs.c.id).where(runs.c.task_id == task_id))
    assert [r.id for r in found] == [run_id]


async def test_every_terminal_path_releases_the_task(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await faulty_provider(http, server)
    ok = await make_agent(http, server, "ok")
    failing = await make_agent(http, server, "failing", provider="faulty", model="sim-1@400")
    hanging = await make_agent(http, server, "hanging", provider="faulty", model="sim-1@hang")
    timing_out = await make_agent(
        http, server, "timing-out", provider="faulty", model="sim-1@hang", max_wall_s=0.2
    )

    done = await until_ended(
        http, server, (await create_task(http, server, ok, "Succeed at the task"))["id"]
    )
    failed = await until_ended(
        http, server, (await create_task(http, server, failing, "Fail at the task"))["id"]
    )
    timed = await until_ended(
        http, server, (await create_task(http, server, timing_out, "Time out on the task"))["id"]
    )
    running = await create_task(http, server, hanging, "Hang until cancelled")
    await until_status(http, server, running["id"], "running")
    assert len(await active_runs(server, running["id"])) == 1
    resp = await post(http, server, f"/api/v1/tasks/{running['id']}/cancel")
    assert resp.status == 200
    cancelled = await until_ended(http, server, running["id"])

    assert [done["status"], failed["status"], timed["status"], cancelled["status"]] == [
        "done",
        "failed",
        "failed",
        "cancelled",
    ]
    for task in (done, failed, timed, cancelled):
        assert await active_runs(server, task["id"]) == [], task["status"]
    # A released task can be checked out again; two retries at once get one run between them.
    # The failing agent now hangs too, so its first retry's run is still active when the
    # second retry lands, however late the second request is.
    async with http.patch(
        f"{server.base_url}/api/v1/agents/{failing['id']}",
        json={"config": {**failing["config"], "model": "sim-1@hang"}},
        headers=server.auth,
    ) as patched:
        assert patched.status == 200, await patched.text()
    for task in (failed, cancelled):
        first, second = await asyncio.gather(
            post(http, server, f"/api/v1/tasks/{task['id']}/retry"),
            post(http, server, f"/api/v1/tasks/{task['id']}/retry"),
        )
        assert sorted([first.status, second.status]) == [201, 409]
        assert len(await active_runs(server, task["id"])) == 1


async def test_a_dead_lettered_delivery_releases_the_task(server: RunningServer) -> None:
    store, clock = server.services.store, server.services.clock
    async with store.write() as conn:
        task, _run = await task_store.insert_task_with_run(
            conn,
            workspace_id=server.boot.workspace_id,
            agent_id=server.boot.agent_id,
            title="t",
            prompt="p" * 10,
            now=clock(),
        )
    # Lost leases, each a failed delivery, until the last allowed attempt dead-letters it.
    policy = RetryPolicy(max_attempts=2, base_s=0.0, max_s=0.0)
    for _ in range(2):
        async with store.write() as conn:
            await conn.execute(
                runs.update()
                .where(runs.c.task_id == task.id, runs.c.status == "queued")
                .values(status="running", attempt=runs.c.attempt + 1, lease_owner="gone")
            )
            held = [
                Held(r.id, r.attempt)
                for r in await conn.execute(
                    sa.select(runs.c.id, runs.c.attempt).where(runs.c.task_id == task.id)
                )
            ]
            await run_store.fail_deliveries(
                conn, held, reason="lease lost", now=clock(), policy=policy
            )
    ended = await rows(server, sa.select(runs.c.status).where(runs.c.task_id == task.id))
    assert [r.status for r in ended] == ["failed"]


# ---- the agent lifecycle ----------------------------------------------------------------


async def test_pause_resume_and_terminate(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await faulty_provider(http, server)
    agent = await make_agent(
        http, server, "worker", provider="faulty", model="sim-1@hang", max_concurrent_runs=1
    )
    first = await create_task(http, server, agent, "The first task")
    second = await create_task(http, server, agent, "The second task")
    await until_status(http, server, first["id"], "running")

    paused = await post(http, server, f"/api/v1/agents/{agent['id']}/pause")
    assert paused.status == 200 and (await paused.json())["status"] == "paused"
    # The running run goes on; once it ends, the queued one is not claimed while paused.
    assert (await get_task(http, server, first["id"]))["status"] == "running"
    assert (await post(http, server, f"/api/v1/tasks/{first['id']}/cancel")).status == 200
    await until_ended(http, server, first["id"])
    await asyncio.sleep(0.5)
    assert (await get_task(http, server, second["id"]))["status"] == "queued"

    resumed = await post(http, server, f"/api/v1/agents/{agent['id']}/resume")
    assert resumed.status == 200 and (await resumed.json())["status"] == "active"
    await until_status(http, server, second["id"], "running")
    third = await create_task(http, server, agent, "The third task")

    terminated = await post(http, server, f"/api/v1/agents/{agent['id']}/terminate")
    assert terminated.status == 200 and (await terminated.json())["status"] == "terminated"
    # Its running and its queued tasks were cancelled.
    assert (await until_ended(http, server, second["id"]))["status"] == "cancelled"
    assert (await until_ended(http, server, third["id"]))["status"] == "cancelled"
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        json={"prompt": "Fourth task", "agent_id": agent["id"]},
        headers=server.auth,
    ) as resp:
        problem = await problem_of(resp, 409)
    assert problem["type"].endswith("/agent-terminated")
    async with http.post(
        f"{server.base_url}/api/v1/agents/{agent['id']}/resume", headers=server.auth
    ) as resp:
        await problem_of(resp, 409)
    actions = [
        r.action
        for r in await rows(server, sa.text("SELECT action FROM audit_events ORDER BY created_at"))
    ]
    assert {"agent.pause", "agent.resume", "agent.terminate"} <= set(actions)


# ---- a tool loop resumed after a crash ----------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def text(self, delta: str) -> None:
        self.events.append(("text", delta))

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        self.events.append((kind.value, data))


class _Crash(Exception):
    pass


class _CrashAfterFirstStep(Team):
    async def commit_step(self, run: ClaimedRun, **kwargs: Any) -> StepResult:
        done = await super().commit_step(run, **kwargs)
        if kwargs["step"] == 1:
            raise _Crash  # the process dies right after the step committed
        return done


async def _claim(server: RunningServer, after: timedelta = timedelta()) -> ClaimedRun:
    async with server.services.store.write() as conn:
        took = await claim_store.claim(
            conn,
            owner="test",
            limit=1,
            now=server.services.clock() + after,
            lease=timedelta(seconds=60),
        )
    assert len(took.runs) == 1
    return took.runs[0]


def _context(run: ClaimedRun, server: RunningServer, events: _Recorder) -> RunContext:
    task = TaskBrief(run.task_id, run.task_key, run.title, run.prompt, run.parent_id)
    return RunContext(run, task, run.agent_name, events, server.services.clock())


@pytest.mark.with_settings(worker_enabled=False)
async def test_a_redelivered_run_resumes_from_its_last_completed_step(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await make_agent(
        http,
        server,
        "steady",
        [
            {"tool_calls": [comment("one")]},
            {"tool_calls": [comment("two")]},
            {"tool_calls": [finish("three")]},
        ],
    )
    task = await create_task(http, server, agent, "Work in three steps")
    services = server.services
    simulator = services.simulator
    assert simulator is not None
    calls_before = simulator.requests["sim-1"]

    run = await _claim(server)
    crashing = LlmAdapter(
        services.gateway, _CrashAfterFirstStep(services.store, services.clock, lambda: None)
    )
    with pytest.raises(_Crash):
        await crashing.run(_context(run, server, _Recorder()))
    # Its lease is lost; the reaper queues the delivery again.
    async with services.store.write() as conn:
        await run_store.fail_deliveries(
            conn, [Held(run.id, run.attempt)], reason="lease expired", now=services.clock()
        )
    again = await _claim(server, after=timedelta(minutes=10))
    assert again.id == run.id and again.attempt == run.attempt + 1 and again.steps == 1

    events = _Recorder()
    adapter = LlmAdapter(services.gateway, Team(services.store, services.clock, lambda: None))
    outcome = await adapter.run(_context(again, server, events))

    assert outcome.status is RunStatus.DONE and outcome.result == "three"
    # Step 1 was not asked of the model again, nor its comment made twice.
    assert simulator.requests["sim-1"] - calls_before == 3
    task_id = UUID(task["id"])
    bodies = await rows(
        server,
        sa.select(task_comments.c.body)
        .where(task_comments.c.task_id == task_id)
        .order_by(task_comments.c.created_at),
    )
    assert [b.body for b in bodies] == ["one", "two"]
    steps = await rows(
        server,
        sa.select(task_steps.c.step, task_steps.c.run_id).where(task_steps.c.task_id == task_id),
    )
    assert sorted(s.step for s in steps) == [1, 2, 3]
    calls = [data["name"] for kind, data in events.events if kind == "tool_call"]
    assert calls == ["comment", "finish"]


async def test_cancelling_a_parent_cancels_its_open_subtasks(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await faulty_provider(http, server)
    lead = await make_agent(
        http, server, "lead", [{"tool_calls": [delegate("stuck", "Wait forever on this")]}]
    )
    await make_agent(
        http, server, "stuck", provider="faulty", model="sim-1@hang", reports_to=lead["id"]
    )
    task = await create_task(http, server, lead, "Delegate and wait")
    await until_status(http, server, task["id"], "blocked")
    async with http.get(
        f"{server.base_url}/api/v1/tasks/{task['id']}/dependencies", headers=server.auth
    ) as resp:
        child = (await resp.json())["children"][0]
    await until_status(http, server, child["id"], "running")

    assert (await post(http, server, f"/api/v1/tasks/{task['id']}/cancel")).status == 200
    assert (await until_ended(http, server, child["id"]))["status"] == "cancelled"
    assert (await get_task(http, server, task["id"]))["status"] == "cancelled"
    assert await active_runs(server, child["id"]) == []
    assert len(await runs_of(server, task["id"])) == 1  # the child's end did not wake it


async def test_the_wall_time_ceiling_counts_the_tasks_earlier_runs(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await faulty_provider(http, server)
    agent = await make_agent(
        http, server, "slow", provider="faulty", model="sim-1@hang", max_wall_s=0.5
    )
    task = await create_task(http, server, agent, "Take all the time there is")
    first = await until_ended(http, server, task["id"])
    assert first["status"] == "failed" and "max_wall_s" in (first["error"] or ""), first
    [elapsed] = await rows(
        server, sa.select(tasks.c.elapsed_s).where(tasks.c.id == UUID(task["id"]))
    )
    assert elapsed.elapsed_s >= 0.5
    simulator = server.services.simulator
    assert simulator is not None
    asked = simulator.total_requests
    assert asked >= 1  # the first run asked the (hanging) provider
    # A retry is the same task: its wall time is used up, so it stops before asking again.
    resp = await post(http, server, f"/api/v1/tasks/{task['id']}/retry")
    assert resp.status == 201, await resp.text()
    again = await until_ended(http, server, task["id"])
    assert again["status"] == "failed" and "max_wall_s" in (again["error"] or ""), again
    assert simulator.total_requests == asked
