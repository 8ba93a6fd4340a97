"""Bullpen as an MCP server (issue 24): the official SDK's client against `/mcp`.

Over a real socket on both backends: a coding assistant's key lists agents, hands a task to
one, waits for it and reads its result and cost, as the REST API shows them; a key of another
workspace sees nothing; a viewer reads but cannot create, comment or cancel (each refusal
audited). Then the HTTP edge: only API keys, only POST, problem+json before the SDK answers.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bullpen.api.mcp.endpoint import PATH, McpEndpoint
from bullpen.app import open_store, utcnow
from bullpen.domain.principal import Role
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings
from bullpen.store.tables import audit_events, task_comments, tasks
from tests.support.db import count, rows
from tests.support.http import bearer, call, problem, read
from tests.support.seed import new_member, other_workspace
from tests.support.servers import RunningServer, start_server
from tests.support.team import faulty_provider

TOOLS = {
    "list_agents",
    "create_task",
    "get_task",
    "wait_for_task",
    "list_tasks",
    "comment_on_task",
    "cancel_task",
}
PROMPT = "Analyze this dataset and extract key metrics"


@asynccontextmanager
async def mcp_client(server: RunningServer, key: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client on `/mcp`, authenticating with `key`."""
    http = httpx2.AsyncClient(headers=bearer(key), timeout=60)
    async with (
        http,
        Client(
            streamable_http_client(server.base_url + "/mcp", http_client=http), mode=mode
        ) as client,
    ):
        yield client


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result, asserting it succeeded."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """A tool error's text, asserting it is one (and no traceback)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert text and "Traceback" not in text and 'File "' not in text
    return text


async def priced_agent(http: aiohttp.ClientSession, server: RunningServer) -> dict[str, Any]:
    """An agent `analyst` on the simulator behind a priced provider, so its runs cost money."""
    assert server.services.simulator is not None
    provider = {
        "name": "priced",
        "base_url": server.services.simulator.base_url,
        "models": [{"name": "sim-1", "input_per_mtok": 2.0, "output_per_mtok": 10.0}],
    }
    assert (await call(http, server, "POST", "/api/v1/providers", body=provider)).status == 201
    agent = {"name": "analyst", "config": {"provider": "priced", "model": "sim-1"}}
    made = await call(http, server, "POST", "/api/v1/agents", body=agent)
    assert made.status == 201, made.text
    return dict(made.body)


async def test_a_coding_assistant_hands_a_task_over_mcp(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent = await priced_agent(http, server)
    async with mcp_client(server, server.boot.api_key) as client:
        listed = await client.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS
        by_name = {tool.name: tool for tool in listed.tools}
        assert by_name["create_task"].input_schema["required"] == ["agent", "prompt"]
        assert by_name["wait_for_task"].input_schema["properties"]["timeout_s"]["maximum"] == 50
        assert by_name["get_task"].annotations and by_name["get_task"].annotations.read_only_hint

        agents = (await ok(client, "list_agents"))["agents"]
        assert {"demo", "analyst"} <= {row["name"] for row in agents}
        assert all("config" not in row for row in agents)

        created = await ok(
            client,
            "create_task",
            agent="analyst",
            prompt=PROMPT,
            labels=["mcp"],
            idempotency_key="k1",
        )
        assert created["status"] == "queued" and created["agent_id"] == agent["id"]
        again = await ok(
            client,
            "create_task",
            agent="analyst",
            prompt=PROMPT,
            labels=["mcp"],
            idempotency_key="k1",
        )
        assert again["replayed"] is True and again["id"] == created["id"]
        other = await refused(
            client, "create_task", agent="analyst", prompt=PROMPT + "!", idempotency_key="k1"
        )
        assert "idempotency-key-mismatch" in other
        nobody = {"agent": str(uuid.uuid4()), "prompt": PROMPT, "idempotency_key": "k2"}
        first = await refused(client, "create_task", **nobody)
        assert first.startswith("Not found (not-found):") and "replayed" not in first
        assert await refused(client, "create_task", **nobody) == first + " (replayed)"

        ended = await ok(client, "wait_for_task", task_id=created["id"], timeout_s=20)
        assert ended["status"] == "done" and ended["timed_out"] is False
        rest = await call(http, server, "GET", f"/api/v1/tasks/{created['id']}")
        runs = await call(http, server, "GET", f"/api/v1/tasks/{created['id']}/runs")
        assert ended["result"] == rest.body["result"] and ended["result"]
        assert ended["cost_usd"] == pytest.approx(runs.body["items"][0]["cost_usd"])
        assert ended["cost_usd"] > 0 and ended["run"]["provider"] == "priced"
        got = await ok(client, "get_task", task_id=created["id"])
        assert {k: v for k, v in ended.items() if k != "timed_out"} == got

        page = await ok(client, "list_tasks", agent_id=agent["id"], status="done")
        assert [row["id"] for row in page["tasks"]] == [created["id"]]
        note = await ok(client, "comment_on_task", task_id=created["id"], body="Thanks, noted.")
        comments = await call(http, server, "GET", f"/api/v1/tasks/{created['id']}/comments")
        assert [c["id"] for c in comments.body["items"]] == [note["id"]]
        assert "cannot be cancelled" in await refused(client, "cancel_task", task_id=created["id"])

    # A run still going when the wait starts (its end wakes it); a run that hangs: waiting
    # times out, cancelling ends it, waiting again sees the end.
    await faulty_provider(http, server)
    for name, model in [("slow", "sim-1@slow:60"), ("stuck", "sim-1@hang")]:
        body = {"name": name, "config": {"provider": "faulty", "model": model}}
        assert (await call(http, server, "POST", "/api/v1/agents", body=body)).status == 201
    async with mcp_client(server, server.boot.api_key, mode="legacy") as client:
        slow = await ok(client, "create_task", agent="slow", prompt=PROMPT)
        done = await ok(client, "wait_for_task", task_id=slow["id"], timeout_s=20)
        assert done["status"] == "done" and len(done["result"].split()) == 24
        stuck = await ok(client, "create_task", agent="stuck", prompt=PROMPT)
        waited = await ok(client, "wait_for_task", task_id=stuck["id"], timeout_s=0.3)
        assert waited["timed_out"] is True and waited["status"] in ("queued", "running")
        cancelled = await ok(client, "cancel_task", task_id=stuck["id"])
        assert cancelled["status"] == "cancelled"
        assert (await ok(client, "wait_for_task", task_id=stuck["id"]))["timed_out"] is False

    # The same audit trail as the REST API's: each action by the key that made it.
    by_key = audit_events.c.actor_type == "api_key"
    actions = [row.action for row in await rows(server, sa.select(audit_events).where(by_key))]
    assert actions.count("task.create") == 3 and "task.comment" in actions
    assert "task.cancel" in actions


async def test_mcp_sees_only_the_callers_workspace_and_role(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    async with svc.store.write() as conn:
        _, _, stranger = await other_workspace(conn, secret=svc.secret, now=svc.clock())
    viewer = await new_member(server, Role.VIEWER, "viewer@x.io")
    async with mcp_client(server, server.boot.api_key) as admin:
        task = await ok(admin, "create_task", agent="demo", prompt=PROMPT)
        await ok(admin, "wait_for_task", task_id=task["id"], timeout_s=20)
    before = (await count(server, tasks), await count(server, task_comments))

    async with mcp_client(server, stranger) as client:
        assert (await ok(client, "list_agents"))["agents"] == []
        assert (await ok(client, "list_tasks"))["tasks"] == []
        for tool, extra in [
            ("get_task", {}),
            ("wait_for_task", {"timeout_s": 1}),
            ("cancel_task", {}),
            ("comment_on_task", {"body": "hello"}),
        ]:
            text = await refused(client, tool, task_id=task["id"], **extra)
            assert text.startswith("Not found (not-found)"), (tool, text)
        assert "not-found" in await refused(client, "create_task", agent="demo", prompt=PROMPT)
        by_id = await refused(client, "create_task", agent=task["agent_id"], prompt=PROMPT)
        assert "not-found" in by_id

    async with mcp_client(server, viewer.key) as client:
        assert (await ok(client, "get_task", task_id=task["id"]))["status"] == "done"
        assert [row["id"] for row in (await ok(client, "list_tasks"))["tasks"]] == [task["id"]]
        for tool, arguments in [
            ("create_task", {"agent": "demo", "prompt": PROMPT}),
            ("comment_on_task", {"task_id": task["id"], "body": "hello"}),
            ("cancel_task", {"task_id": task["id"]}),
        ]:
            text = await refused(client, tool, **arguments)
            assert text == "Forbidden (forbidden): this needs the `tasks:write` permission"

    assert (await count(server, tasks), await count(server, task_comments)) == before
    denied = await rows(
        server,
        sa.select(audit_events).where(
            audit_events.c.action == "access.denied", audit_events.c.actor_id == viewer.key_id
        ),
    )
    assert sorted(row.data["tool"] for row in denied) == [
        "cancel_task",
        "comment_on_task",
        "create_task",
    ]
    assert all(row.data["path"] == "/mcp" for row in denied)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_mcp_edge_answers_as_the_api_does(
    server: RunningServer, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = server.base_url + "/mcp"
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in [{}, bearer("bp_" + "x" * 40), {"Cookie": "bullpen_session=whatever"}]:
        async with http.post(url, json=rpc, headers={**accept, **headers}) as resp:
            body = problem(await read(resp), 401)
            assert resp.headers["WWW-Authenticate"] == "Bearer"
            assert "bp_" + "x" * 40 not in str(body)
    async with http.get(url, headers=server.auth) as resp:
        problem(await read(resp), 405)
        assert resp.headers["Allow"] == "POST"
    big = {**rpc, "params": {"pad": "x" * (server.settings.max_body_bytes + 1)}}
    async with http.post(url, json=big, headers={**accept, **server.auth}) as resp:
        problem(await read(resp), 413)
    async with http.post(url, data=b"{not json", headers={**accept, **server.auth}) as resp:
        assert resp.status == 400 and "Traceback" not in await resp.text()

    canary = f"CANARY{uuid.uuid4().hex}"
    async with mcp_client(server, server.boot.api_key) as client:
        assert "Unknown tool 'nope'" in await refused(client, "nope")
        text = await refused(
            client, "create_task", agent="demo", prompt="short", labels=[f"a {canary}"]
        )
        assert text.startswith("Invalid arguments (validation): prompt:") and "labels.0" in text
        assert canary not in text  # what was sent is never echoed back
        assert "Extra inputs" in await refused(client, "list_agents", extra=1)
        too_long = await refused(client, "wait_for_task", task_id=str(uuid.uuid4()), timeout_s=51)
        assert "timeout_s" in too_long

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(canary)

        monkeypatch.setattr(server.services.tasks, "get", broken)
        text = await refused(client, "get_task", task_id=str(uuid.uuid4()))
        assert text == "Internal error: something went wrong on our side; it has been logged."


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.with_settings(rate_limit_key_rps=0.01, rate_limit_key_burst=3)
async def test_mcp_requests_count_against_the_keys_rate_limit(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_agents"}}
    headers = {"Accept": "application/json, text/event-stream", **server.auth}
    statuses = []
    for _ in range(4):
        async with http.post(server.base_url + "/mcp", json=rpc, headers=headers) as resp:
            reply = await read(resp)
            statuses.append(reply.status)
    assert statuses == [200, 200, 200, 429]
    problem(reply, 429)
    assert int(reply.headers["Retry-After"]) >= 1


def test_the_app_starts_without_the_mcp_sdk() -> None:
    """The SDK costs ~25 MB and 0.4 s of import: a fresh interpreter that builds the app and
    its services' modules has not loaded it."""
    script = (
        "import sys\n"
        "import bullpen.app, bullpen.cli.main\n"
        "from bullpen.api.app import create_app\n"
        "from bullpen.settings import Settings\n"
        "create_app(Settings(_env_file=None))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_mcp_server_starts_on_its_first_request_and_stops_with_the_app(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with open_store(settings) as st:
        boot = await ensure_bootstrap(
            st, load_secret(settings.secret_key, settings.data_dir), utcnow
        )
    srv, task, base_url = await start_server(settings)
    (endpoint,) = [r.app for r in srv.config.app.routes if getattr(r, "path", "") == PATH]
    assert isinstance(endpoint, McpEndpoint)
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    try:
        assert not endpoint.started
        async with http.post(base_url + PATH, json=rpc, headers=headers) as resp:
            problem(await read(resp), 401)  # refused before the SDK is loaded
        assert not endpoint.started

        async def listed() -> set[str]:
            key = bearer(boot.api_key)
            async with http.post(base_url + PATH, json=rpc, headers={**headers, **key}) as resp:
                reply = await read(resp)
                assert reply.status == 200, reply.body
                return {tool["name"] for tool in reply.body["result"]["tools"]}

        # Requests arriving together while it starts all wait for the one start.
        assert await asyncio.gather(*(listed() for _ in range(4))) == [TOOLS] * 4
        assert endpoint.started
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 15)
    assert not endpoint.started
