"""`http` and `process` agents through the API and the worker, on both backends."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from bullpen.store.tables import audit_events, run_events
from tests.support.db import rows
from tests.support.http import problem_of
from tests.support.servers import RunningServer
from tests.support.team import create_task, until_ended

SECRET = "whsec-canary-0123456789abcdef"


@pytest.fixture
async def webhook() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook agent on a real socket: checks the signature, streams NDJSON events."""
    seen: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        stamp = request.headers["Bullpen-Timestamp"]
        mac = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
        if request.headers["Bullpen-Signature"] != f"v1={mac.hexdigest()}":
            return web.Response(status=401)
        context = json.loads(body)
        seen.append(context)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for event in (
            {"type": "log", "message": "thinking"},
            {"type": "text", "text": "hook says "},
            {"type": "text", "text": context["task"]["title"]},
            {"type": "result", "result": f"handled {context['task']['key']}"},
        ):
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hook", seen
    finally:
        await runner.cleanup()


async def create_agent(
    http: aiohttp.ClientSession, server: RunningServer, body: dict[str, Any]
) -> aiohttp.ClientResponse:
    async with http.post(f"{server.base_url}/api/v1/agents", json=body, headers=server.auth) as r:
        await r.read()
        return r


@pytest.mark.with_settings(outbound_allow="")
async def test_a_webhook_to_a_private_address_is_refused_by_default(
    server: RunningServer, http: aiohttp.ClientSession, webhook: tuple[str, Any]
) -> None:
    url, _seen = webhook
    body = {"name": "hook", "adapter": "http", "config": {"url": url, "secret": SECRET}}
    resp = await create_agent(http, server, body)
    problem = await problem_of(resp, 422)
    assert "BULLPEN_OUTBOUND_ALLOW" in problem["detail"] and SECRET not in json.dumps(problem)


@pytest.mark.with_settings(outbound_allow="127.0.0.1/32")
async def test_a_webhook_agent_runs_a_task_and_its_secret_never_shows(
    server: RunningServer, http: aiohttp.ClientSession, webhook: tuple[str, Any]
) -> None:
    url, seen = webhook
    body = {"name": "hook", "adapter": "http", "config": {"url": url, "secret": SECRET}}
    resp = await create_agent(http, server, body)
    assert resp.status == 201
    agent = await resp.json()
    assert set(agent["config"]) == {"url", "timeout_s", "connect_timeout_s", "secret_hint"}

    # A config change without a secret keeps the sealed one.
    async with http.patch(
        f"{server.base_url}/api/v1/agents/{agent['id']}",
        json={"config": {"url": url, "timeout_s": 30}},
        headers=server.auth,
    ) as patched:
        assert patched.status == 200 and (await patched.json())["config"]["timeout_s"] == 30

    task = await create_task(http, server, agent, "Handle this webhook task")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done" and ended["result"] == f"handled {task['number']}"
    assert seen[0]["task"]["id"] == task["id"] and seen[0]["agent"]["name"] == "hook"
    events = await rows(server, sa.select(run_events).order_by(run_events.c.seq))
    kinds = [e.kind for e in events]
    assert "log" in kinds and kinds[-1] == "end"
    assert "".join(e.data["text"] for e in events if e.kind == "text") == (
        "hook says Handle this webhook task"
    )
    # The secret is in no response, event or audit record.
    audit = json.dumps(
        [dict(r._mapping) for r in await rows(server, sa.select(audit_events))], default=str
    )
    async with http.get(f"{server.base_url}/api/v1/agents", headers=server.auth) as listed:
        listing = await listed.text()
    for text in (audit, listing, json.dumps([e.data for e in events]), json.dumps(ended)):
        assert SECRET not in text


async def test_process_agents_are_off_unless_the_operator_allows_a_command(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {"name": "cmd", "adapter": "process", "config": {"command": ["/bin/echo", "hi"]}}
    problem = await problem_of(await create_agent(http, server, body), 422)
    assert "BULLPEN_PROCESS_ALLOW" in problem["detail"]


@pytest.mark.with_settings(process_allow="/usr/bin/env,/bin/echo", process_env_allow="GREETING")
async def test_a_process_agent_runs_with_no_secret_in_its_environment(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {
        "name": "env",
        "adapter": "process",
        "config": {"command": ["/usr/bin/env"], "env": {"GREETING": "hello"}},
    }
    resp = await create_agent(http, server, body)
    assert resp.status == 201, await resp.text()
    agent = await resp.json()
    task = await create_task(http, server, agent, "Print the environment")
    ended = await until_ended(http, server, task["id"])
    assert ended["status"] == "done"
    environment = dict(line.split("=", 1) for line in ended["result"].splitlines() if "=" in line)
    assert environment["GREETING"] == "hello"
    assert environment["BULLPEN_TASK_ID"] == task["id"]
    secret_key = server.services.settings.secret_key
    assert secret_key and secret_key not in ended["result"]
    assert not {k for k in environment if k.startswith("BULLPEN_")} - {
        "BULLPEN_RUN_ID",
        "BULLPEN_TASK_ID",
    }
    # A command off the list is refused when configured.
    other = {"name": "sh", "adapter": "process", "config": {"command": ["/bin/sh", "-c", "id"]}}
    await problem_of(await create_agent(http, server, other), 422)
