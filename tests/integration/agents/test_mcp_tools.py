"""MCP servers' tools for `llm` agents, against real MCP servers built with the official SDK
(tests/support/mcp_tools.py) over streamable HTTP and stdio, on both backends.

The agents are on the simulated provider, scripted (`<sim-script>`) to call the tools.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp.abc import AbstractResolver, ResolveResult

from bullpen.agents.base import RunContext, TaskBrief
from bullpen.agents.llm import LlmAdapter
from bullpen.agents.mcp import INTERRUPTED, McpClient, McpServer, McpUnavailable
from bullpen.agents.process_env import EnvAllow
from bullpen.domain.events import EventKind
from bullpen.domain.runs import ClaimedRun, Held
from bullpen.domain.status import RunStatus
from bullpen.security.outbound import OutboundAllow
from bullpen.services.team import Team
from bullpen.store import claims as claim_store
from bullpen.store import runs as run_store
from bullpen.store.tables import audit_events, mcp_servers, run_events, task_open_steps, task_steps
from tests.support.canary import encodings
from tests.support.db import rows
from tests.support.http import Reply, call, problem
from tests.support.mcp_tools import calls_in, serve_http, stdio_command
from tests.support.servers import RunningServer
from tests.support.team import create_task, finish, make_agent, until_ended


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


async def add_server(
    http: aiohttp.ClientSession, server: RunningServer, body: dict[str, Any]
) -> dict[str, Any]:
    reply = await call(http, server, "POST", "/api/v1/mcp-servers", body=body)
    assert reply.status == 201, reply.text
    return dict(reply.body)


async def tool_results(server: RunningServer, task_id: str) -> list[dict[str, Any]]:
    found = await rows(
        server,
        sa.select(run_events.c.data)
        .where(run_events.c.task_id == UUID(task_id), run_events.c.kind == "tool_result")
        .order_by(run_events.c.created_at, run_events.c.seq),
    )
    return [dict(r.data) for r in found]


@pytest.mark.with_settings(process_allow=sys.executable, mcp_result_max_chars=1000)
async def test_an_agent_lists_and_calls_mcp_tools_over_http_and_stdio(
    server: RunningServer,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    log = tmp_path / "calls.log"
    canary = "Bearer mcp-canary-" + secrets.token_hex(16)
    replies: list[Reply] = []
    async with serve_http(log) as web:
        created = await add_server(
            http,
            server,
            {
                "name": "web",
                "transport": "http",
                "url": web.url,
                "headers": {"Authorization": canary},
                "timeout_s": 2.0,
            },
        )
        assert created["header_hints"] == {"Authorization": canary[:3] + "…" + canary[-4:]}
        local = await add_server(
            http,
            server,
            {"name": "local", "transport": "stdio", "command": stdio_command(log), "timeout_s": 30},
        )
        for row in (created, local):
            listed = await call(http, server, "POST", f"/api/v1/mcp-servers/{row['id']}/test")
            replies.append(listed)
            assert listed.status == 200, listed.text
            names = {t["wire_name"] for t in listed.body["items"]}
            assert {f"{row['name']}__add", f"{row['name']}__note"} <= names
        assert all(h.get("authorization") == canary for h in web.headers)

        agent = await make_agent(
            http,
            server,
            "toolsmith",
            [
                {"tool_calls": [tool("web__add", a=2, b=3), tool("local__add", a=4, b=5)]},
                {"tool_calls": [tool("web__hang"), tool("web__secret"), tool("local__whereami")]},
                {"tool_calls": [tool("web__note", text="y" * 50), tool("web__big")]},
                {"tool_calls": [finish("done with tools")]},
            ],
            mcp=[
                {
                    "server": "web",
                    "tools": [
                        "add",
                        "hang",
                        "big",
                        {"name": "note", "arguments": {"text": {"max_length": 10}}},
                    ],
                },
                {"server": "local", "tools": ["add", "whereami"]},
            ],
        )
        task = await create_task(http, server, agent, "Use your tools")
        ended = await until_ended(http, server, task["id"], timeout_s=60)

    assert ended["status"] == "done" and ended["result"] == "done with tools", ended
    results = {r["name"]: r["result"] for r in await tool_results(server, task["id"])}
    assert results["web__add"] == "5" and results["local__add"] == "9"
    # A hanging tool times out; the model gets the error and the run goes on.
    assert results["web__hang"].startswith("error: could not call 'hang' on MCP server 'web'")
    assert "no answer within 2 s" in results["web__hang"]
    # A tool the agent is not allowed is refused without calling it.
    assert results["web__secret"] == (
        "error: 'secret' of MCP server 'web' is not a tool this agent may use"
    )
    assert "SECRET CALLED" not in calls_in(log)
    # The argument limit refuses before the call; a long result is cut.
    assert results["web__note"] == (
        "error: refused by this agent's limits: 'text' is longer than 10 characters"
    )
    assert calls_in(log) == []
    assert results["web__big"].startswith("x" * 1000 + "\n[… result cut at 1000 characters")
    # The stdio server ran in a clean environment, in a directory of its own.
    where = json.loads(results["local__whereami"])
    assert set(where["env"]) == {"PATH", "LANG", "HOME"}, where["env"]
    assert where["env"]["HOME"] == where["cwd"] and "bullpen-mcp-" in where["cwd"]
    # Every step was committed once and none is left open.
    steps = await rows(
        server, sa.select(task_steps.c.step).where(task_steps.c.task_id == UUID(task["id"]))
    )
    assert sorted(s.step for s in steps) == [1, 2, 3, 4]
    assert await rows(server, sa.select(task_open_steps)) == []

    # The header's value is in no response, event, step, audit record, stored row or log line.
    replies.append(await call(http, server, "GET", "/api/v1/mcp-servers"))
    replies.append(await call(http, server, "GET", f"/api/v1/mcp-servers/{created['id']}"))
    sinks = [r.text for r in replies]
    # Log records of Bullpen and of the client side (the test's MCP server logs its own).
    sinks += [
        f"{r.name} {r.getMessage()} {r.exc_text or ''}"
        for r in caplog.records
        if not r.name.startswith(("mcp.server", "uvicorn", "sse_starlette"))
    ]
    for table in (run_events, task_steps, audit_events, mcp_servers):
        sinks.extend(repr(tuple(r)) for r in await rows(server, sa.select(table)))
    forms = encodings(canary.removeprefix("Bearer "))
    assert not [f for f in forms for sink in sinks if f in sink]


class _Crash(Exception):
    pass


class _CrashMidStep(Team):
    """Dies once the step's second call is marked started, before it is made."""

    async def mark_call(
        self, run: ClaimedRun, step: int, index: int, state: dict[str, Any]
    ) -> None:
        await super().mark_call(run, step, index, state)
        if index == 1 and state["state"] == "started":
            raise _Crash


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


class _Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def text(self, delta: str) -> None:
        pass

    def emit(self, kind: EventKind, data: dict[str, Any]) -> None:
        self.events.append((kind.value, data))


def _context(run: ClaimedRun, server: RunningServer, events: _Events) -> RunContext:
    task = TaskBrief(run.task_id, run.task_key, run.title, run.prompt, run.parent_id)
    return RunContext(run, task, run.agent_name, events, server.services.clock())


@pytest.mark.with_settings(worker_enabled=False)
async def test_a_run_delivered_again_after_a_crash_never_calls_a_tool_twice(
    server: RunningServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    services = server.services
    async with serve_http(log) as web:
        await add_server(http, server, {"name": "web", "transport": "http", "url": web.url})
        agent = await make_agent(
            http,
            server,
            "once",
            [
                {"tool_calls": [tool("web__note", text="first"), tool("web__note", text="second")]},
                {"tool_calls": [finish("finished")]},
            ],
            mcp=[{"server": "web", "tools": ["note"]}],
        )
        await create_task(http, server, agent, "Note two things")
        simulator = services.simulator
        assert simulator is not None
        asked = simulator.requests["sim-1"]
        run = await _claim(server)
        team = _CrashMidStep(services.store, services.clock, lambda: None)
        crashing = LlmAdapter(services.gateway, team, mcp=services.mcp_tools)
        with pytest.raises(_Crash):
            await crashing.run(_context(run, server, _Events()))
        assert calls_in(log) == ["first"]
        async with services.store.write() as conn:  # its lease is lost: delivered again
            await run_store.fail_deliveries(
                conn, [Held(run.id, run.attempt)], reason="lease expired", now=services.clock()
            )
        again = await _claim(server, after=timedelta(minutes=10))
        assert again.id == run.id and again.attempt == run.attempt + 1
        events = _Events()
        adapter = LlmAdapter(
            services.gateway,
            Team(services.store, services.clock, lambda: None),
            mcp=services.mcp_tools,
        )
        outcome = await adapter.run(_context(again, server, events))

    assert outcome.status is RunStatus.DONE and outcome.result == "finished"
    # The first call was made once (its stored result reused); the second was started before
    # the crash, so it is never made: the model is told its outcome is unknown.
    assert calls_in(log) == ["first"]
    results = [d["result"] for kind, d in events.events if kind == "tool_result"]
    assert results == ["noted first", INTERRUPTED, "finished"]
    # Step 1 was carried out from its open record, not asked of the model again.
    assert simulator.requests["sim-1"] - asked == 2
    assert [d["name"] for kind, d in events.events if kind == "tool_call"] == ["finish"]
    assert await rows(server, sa.select(task_open_steps)) == []


async def test_a_tool_that_needs_approval_waits_and_runs_once_approved(
    server: RunningServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    async with serve_http(log) as web:
        await add_server(http, server, {"name": "web", "transport": "http", "url": web.url})
        agent = await make_agent(
            http,
            server,
            "careful",
            [{"tool_calls": [tool("web__note", text="approved")]}, {"text": "ALL DONE"}],
            mcp=[{"server": "web", "tools": ["note"]}],
            approval_tools=["web__note"],
        )
        task = await create_task(http, server, agent, "Note it once approved")
        pending = None
        for _ in range(200):
            reply = await call(http, server, "GET", "/api/v1/approvals?status=pending&limit=100")
            found = [a for a in reply.body["items"] if a["task_id"] == task["id"]]
            if found:
                pending = found[0]
                break
            await asyncio.sleep(0.05)
        assert pending is not None and pending["kind"] == "tool_call"
        assert calls_in(log) == []
        decided = await call(
            http, server, "POST", f"/api/v1/approvals/{pending['id']}/approve", body={}
        )
        assert decided.status == 200, decided.text
        ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done" and ended["result"] == "ALL DONE", ended
    assert calls_in(log) == ["approved"]


async def test_mcp_servers_api_checks_what_it_stores(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {"name": "srv", "transport": "http", "url": "http://127.0.0.1:9/mcp"}
    row = await add_server(http, server, {**body, "headers": {"X-Api-Key": "k" * 20}})
    assert row["header_hints"] == {"X-Api-Key": "kkk…kkkk"} and "headers" not in row
    taken = await call(http, server, "POST", "/api/v1/mcp-servers", body=body)
    assert problem(taken, 409)["type"].endswith("/conflict")
    # Headers go only where they were given for.
    moved = await call(
        http,
        server,
        "PATCH",
        f"/api/v1/mcp-servers/{row['id']}",
        body={"url": "http://127.0.0.1:10/mcp"},
    )
    assert problem(moved, 422)["type"].endswith("/mcp-headers-required")
    moved = await call(
        http,
        server,
        "PATCH",
        f"/api/v1/mcp-servers/{row['id']}",
        body={"url": "http://127.0.0.1:10/mcp", "headers": {}},
    )
    assert moved.status == 200 and moved.body["header_hints"] == {}, moved.text
    # A closed port: the test is a problem.
    tested = await call(http, server, "POST", f"/api/v1/mcp-servers/{row['id']}/test")
    detail = problem(tested, 502)["detail"]
    # Allowed but not public (127.0.0.1/32): a closed port looks like any other failure.
    assert detail == (
        "could not list the tools of MCP server 'srv': it is at a non-public address, whose "
        "errors are not shown (the server log has them)"
    )
    # Commands off the operator's list, stdio fields on http servers, reserved headers.
    for bad in (
        {"name": "cmd", "transport": "stdio", "command": ["/bin/sh", "-c", "true"]},
        {"name": "mixed", "transport": "http", "url": "http://127.0.0.1:9/", "command": ["/x"]},
        {"name": "nourl", "transport": "http"},
        {"name": "host", "transport": "http", "url": body["url"], "headers": {"Host": "x"}},
        {"name": "Upper", "transport": "http", "url": body["url"]},
    ):
        reply = await call(http, server, "POST", "/api/v1/mcp-servers", body=bad)
        problem(reply, 422)
    deleted = await call(http, server, "DELETE", f"/api/v1/mcp-servers/{row['id']}")
    assert deleted.status == 204
    gone = await call(http, server, "GET", f"/api/v1/mcp-servers/{row['id']}")
    problem(gone, 404)


@pytest.mark.with_settings(outbound_allow="")
async def test_an_mcp_server_on_a_private_address_is_refused_unless_allowed(
    server: RunningServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with serve_http(tmp_path / "calls.log") as web:
        body = {"name": "p", "transport": "http", "url": web.url}
        refused = await call(http, server, "POST", "/api/v1/mcp-servers", body=body)
        assert problem(refused, 422)["type"].endswith("/outbound-refused")
        # A name that resolves to a private address is refused where it connects.
        port = web.url.split(":")[2].split("/")[0]
        named = McpServer(
            id="x",
            version="1",
            name="named",
            transport="http",
            url=f"http://mcp.internal.test:{port}/mcp",
            headers={},
            command=None,
            env={},
            timeout_s=5.0,
        )
        resolver = StubResolver({"mcp.internal.test": ["127.0.0.1"]})
        client = _client(OutboundAllow(), resolver)
        with pytest.raises(McpUnavailable) as caught:
            await client.tools(named)
        assert "refused to call mcp.internal.test (127.0.0.1)" in caught.value.detail
        assert web.headers == []  # nothing reached the server
        allowed = _client(OutboundAllow.parse("127.0.0.1/32"), resolver)
        listed = await allowed.tools(named)
        assert "add" in {t.name for t in listed} and web.headers


def _client(allow: OutboundAllow, resolver: Any) -> McpClient:
    return McpClient(
        allow,
        process_allow=(),
        env_allow=EnvAllow(),
        ttl_s=60.0,
        clock=time.monotonic,
        resolver=resolver,
    )


class StubResolver(AbstractResolver):
    """DNS as the test wants it: each name resolves to the addresses given."""

    def __init__(self, answers: Mapping[str, list[str]]) -> None:
        self.answers = answers

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.answers:
            raise OSError(f"no such name {host!r}")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.answers[host]
        ]

    async def close(self) -> None:
        pass
