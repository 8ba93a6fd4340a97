"""A team of agents over a real socket, on both backends: delegation, waking, the org chart.

The agents are `llm` agents on the simulated provider, scripted (`<sim-script>` in their
system prompts) to call Bullpen's tools.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.store.tables import task_steps, tasks
from tests.support.db import rows
from tests.support.http import problem_of
from tests.support.servers import RunningServer
from tests.support.team import (
    create_task,
    delegate,
    finish,
    make_agent,
    runs_of,
    until_ended,
)


async def test_a_lead_delegates_down_two_levels_and_builds_its_result_from_theirs(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    lead = await make_agent(
        http,
        server,
        "lead",
        [
            {"tool_calls": [delegate("analyst", "Analyse part A"), delegate("writer", "Draft B")]},
            {"tool_calls": [finish("LEAD SUMMARY: {{context}}")]},
        ],
    )
    analyst = await make_agent(
        http,
        server,
        "analyst",
        [
            {"tool_calls": [delegate("researcher", "Dig into part A")]},
            {"tool_calls": [finish("ANALYST: {{context}}")]},
        ],
        reports_to=lead["id"],
    )
    writer = await make_agent(
        http, server, "writer", [{"text": "WRITER DRAFT"}], reports_to=lead["id"]
    )
    assert writer["reports_to"] == lead["id"]
    researcher = await make_agent(http, server, "researcher", reports_to=analyst["id"])

    task = await create_task(http, server, lead, "Produce the quarterly report")
    ended = await until_ended(http, server, task["id"])

    assert ended["status"] == "done", ended
    async with http.get(
        f"{server.base_url}/api/v1/tasks/{task['id']}/dependencies", headers=server.auth
    ) as resp:
        deps = await resp.json()
    kids = {child["agent"]: child for child in deps["children"]}
    assert sorted(kids) == ["analyst", "writer"] and deps["blockers"] == []
    assert all(child["status"] == "done" for child in kids.values())
    assert kids["writer"]["result"] == "WRITER DRAFT"
    async with http.get(
        f"{server.base_url}/api/v1/tasks/{kids['analyst']['id']}/dependencies",
        headers=server.auth,
    ) as resp:
        grandkids = (await resp.json())["children"]
    assert [g["agent"] for g in grandkids] == ["researcher"]
    researched = grandkids[0]["result"]
    assert researched and grandkids[0]["status"] == "done"
    # The lead's result is built from its reports', which hold the researcher's.
    result = ended["result"]
    assert result.startswith("LEAD SUMMARY: These subtasks and blockers have ended:")
    assert "WRITER DRAFT" in result and "ANALYST: " in result and researched in result
    assert (
        kids["analyst"]["result"].startswith("ANALYST: ")
        and researched in kids["analyst"]["result"]
    )

    # The lead and the analyst were each woken once; the others ran once.
    lead_runs = await runs_of(server, task["id"])
    analyst_runs = await runs_of(server, kids["analyst"]["id"])
    writer_runs = await runs_of(server, kids["writer"]["id"])
    assert [r.status for r in lead_runs] == ["done", "done"]
    assert [r.status for r in analyst_runs] == ["done", "done"]
    assert [r.status for r in writer_runs] == ["done"]
    assert len(await runs_of(server, grandkids[0]["id"])) == 1
    # The subtasks ran at once: the writer ran while the analyst's task was open, and the
    # lead woke only after both had ended.
    assert writer_runs[0].started_at < analyst_runs[-1].finished_at
    last_child_end = max(analyst_runs[-1].finished_at, writer_runs[-1].finished_at)
    assert lead_runs[1].queued_at >= last_child_end
    assert lead_runs[0].finished_at <= lead_runs[1].queued_at
    # One subtask per delegate call: the steps are recorded once each.
    steps = await rows(
        server, sa.select(task_steps.c.step).where(task_steps.c.task_id == UUID(task["id"]))
    )
    assert sorted(s.step for s in steps) == [1, 2]
    children = await rows(
        server, sa.select(tasks.c.id).where(tasks.c.parent_id == UUID(task["id"]))
    )
    assert len(children) == 2
    assert researcher["reports_to"] == analyst["id"]


async def test_the_org_chart_nests_reports_and_refuses_cycles(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    ceo = await make_agent(http, server, "ceo")
    cto = await make_agent(http, server, "cto", reports_to=ceo["id"])
    dev = await make_agent(http, server, "dev", reports_to=cto["id"])
    async with http.get(f"{server.base_url}/api/v1/agents/tree", headers=server.auth) as resp:
        chart = await resp.json()
    by_name = {node["name"]: node for node in chart["roots"]}
    assert [r["name"] for r in by_name["ceo"]["reports"]] == ["cto"]
    assert [r["name"] for r in by_name["ceo"]["reports"][0]["reports"]] == ["dev"]
    assert "cto" not in by_name and "dev" not in by_name

    url = f"{server.base_url}/api/v1/agents/{ceo['id']}"
    async with http.patch(url, json={"reports_to": dev["id"]}, headers=server.auth) as resp:
        problem = await problem_of(resp, 409)
    assert "cycle" in problem["detail"]
    async with http.patch(url, json={"reports_to": ceo["id"]}, headers=server.auth) as resp:
        await problem_of(resp, 409)
    missing = "00000000-0000-4000-8000-000000000000"
    async with http.patch(url, json={"reports_to": missing}, headers=server.auth) as resp:
        await problem_of(resp, 404)
    async with http.patch(
        f"{server.base_url}/api/v1/agents/{dev['id']}",
        json={"reports_to": None},
        headers=server.auth,
    ) as resp:
        assert resp.status == 200 and (await resp.json())["reports_to"] is None


async def test_the_org_chart_path_is_read_only(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    url = f"{server.base_url}/api/v1/agents/tree"
    for method in ("OPTIONS", "PATCH", "DELETE", "PUT"):
        async with http.request(method, url, json={"title": "x"}, headers=server.auth) as resp:
            problem = await problem_of(resp, 405)
            assert resp.headers["Allow"] == "GET, HEAD", (method, resp.headers["Allow"])
        assert problem["type"].endswith("/method-not-allowed")


def tool_results(steps: list[Any]) -> list[str]:
    """The tool results of a task's stored steps, in order."""
    return [m["content"] for s in steps for m in s.messages if m["role"] == "tool"]


@pytest.mark.with_settings(task_max_depth=1)
async def test_delegating_deeper_than_the_cap_is_a_tool_error(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    lead = await make_agent(
        http,
        server,
        "lead",
        [
            {"tool_calls": [delegate("analyst", "Analyse part A")]},
            {"tool_calls": [finish("LEAD DONE")]},
        ],
    )
    analyst = await make_agent(
        http,
        server,
        "analyst",
        [
            {"tool_calls": [delegate("researcher", "Dig into part A")]},
            {"tool_calls": [finish("ANALYST DONE")]},
        ],
        reports_to=lead["id"],
    )
    await make_agent(http, server, "researcher", reports_to=analyst["id"])
    task = await create_task(http, server, lead, "Produce the quarterly report")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done", ended
    child = await rows(server, sa.select(tasks).where(tasks.c.parent_id == UUID(task["id"])))
    assert [c.status for c in child] == ["done"] and child[0].result == "ANALYST DONE"
    # The analyst's task is at the cap: its delegate was refused, and it did the work itself.
    assert await rows(server, sa.select(tasks).where(tasks.c.parent_id == child[0].id)) == []
    steps = await rows(
        server,
        sa.select(task_steps).where(task_steps.c.task_id == child[0].id).order_by("step"),
    )
    assert tool_results(steps)[0].startswith("error: subtasks nest at most 1 levels")


async def test_nul_in_a_tool_call_is_a_tool_error_on_both_backends(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    lead = await make_agent(
        http,
        server,
        "lead",
        [
            {
                "tool_calls": [
                    delegate("analyst", "Analyse\x00part A"),
                    {"name": "comment", "arguments": {"body": "nul\x00here"}},
                ]
            },
            {"tool_calls": [finish("no\x00result")]},
            {"tool_calls": [finish("LEAD DONE")]},
        ],
    )
    await make_agent(http, server, "analyst", reports_to=lead["id"])
    task = await create_task(http, server, lead, "Produce the quarterly report")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done" and ended["result"] == "LEAD DONE", ended
    assert await rows(server, sa.select(tasks).where(tasks.c.parent_id == UUID(task["id"]))) == []
    steps = await rows(
        server,
        sa.select(task_steps).where(task_steps.c.task_id == UUID(task["id"])).order_by("step"),
    )
    assert tool_results(steps) == [
        "error: 'prompt' must not contain NUL characters",
        "error: 'body' must not contain NUL characters",
        "error: 'result' must not contain NUL characters",
        "finished",
    ]
