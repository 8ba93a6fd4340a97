"""SE-1 (TEST-PLAN): canary secrets of every kind, swept for across every sink.

One workspace is given a canary of each secret Bullpen holds: a user's password, an API key,
a browser session, a webhook agent's signing secret, a `process` agent's secret environment
value and a provider key. They are then used along success and failure paths: signing in
(right and wrong), the key calling the API, the relay and the MCP server, the session reading
pages and the API, the process agent running, the webhook agent failing to reach its (closed)
loopback port, providers answering errors. Afterwards none of them may appear, plain or
encoded, in any response (status line, headers, body; the one response that hands out a new
key and the `Set-Cookie` of a sign-in are the only places a secret is meant to travel), in
the task and workspace event streams, in the audit log, in `/metrics`, in any log record, or
in any database row (sealed values are bytes under AES-GCM, and digests are not the secret).
The provider key has its own, deeper sweep in `test_gateway_runs.py`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.api.deps import SESSION_COOKIE
from bullpen.store.tables import metadata
from tests.support.canary import encodings
from tests.support.http import call
from tests.support.login import post_login
from tests.support.servers import RunningServer
from tests.support.sse import read_events
from tests.support.team import create_task, until_ended

SH = "/bin/sh"
CANARIES = {
    "password": "pw-canary-" + secrets.token_hex(12),
    "webhook secret": "wh-canary-" + secrets.token_hex(12),
    "secret env": "env-canary-" + secrets.token_hex(12),
    "provider key": "sk-canary-" + secrets.token_hex(12),
}


@pytest.mark.with_settings(process_allow=SH, process_env_allow="API_*")
async def test_no_secret_reaches_any_sink(
    server: RunningServer, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    meant: list[str] = []  # where secrets are handed out on purpose

    async def api(method: str, path: str, body: Any = None, **headers: str) -> Any:
        reply = await call(http, server, method, path, body=body, headers=headers or None)
        seen.append(f"{method} {path} {reply.status} {dict(reply.headers)} {reply.text}")
        return reply

    # A user with a canary password; wrong and right sign-ins; the session it gets.
    user = {"email": "sweep@example.com", "name": "Sweep", "password": CANARIES["password"]}
    created = await api("POST", "/api/v1/users", user, **server.auth)
    assert created.status == 201, created.text
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as browser:
        wrong, page = await post_login(browser, server, user["email"], CANARIES["password"] + "x")
        seen.append(f"{wrong.status} {dict(wrong.headers)} {page}")
        right, page = await post_login(browser, server, server.boot.email, server.boot.password)
        assert right.status == 303
        session = right.cookies[SESSION_COOKIE].value
        meant.append(dict(right.headers)["Set-Cookie"])
        seen.append(f"{right.status} {page}")
        cookie = {"Cookie": f"{SESSION_COOKIE}={session}"}
        for path in ("/", "/account", "/api/v1/tasks", "/api/v1/users/me"):
            async with browser.get(server.base_url + path, headers=cookie) as resp:
                seen.append(f"{resp.status} {dict(resp.headers)} {await resp.text()}")
    CANARIES["session"] = session

    # A new API key, handed out once, then used on the API and the relay.
    made = await call(
        http, server, "POST", "/api/v1/api-keys", body={"name": "sweep"}, headers=server.auth
    )
    assert made.status == 201
    meant.append(made.text)
    key = made.body["key"]
    CANARIES["api key"] = key
    bearer = {"Authorization": f"Bearer {key}"}
    await api("GET", "/api/v1/api-keys", **bearer)
    await api("GET", f"/api/v1/api-keys/{made.body['id']}", **bearer)
    # The dashboard's settings list the key (its hint only) and the members.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as browser:
        for path in ("/settings/api-keys", "/settings/members", "/settings/invitations"):
            async with browser.get(server.base_url + path, headers=cookie) as resp:
                assert resp.status == 200
                seen.append(f"{resp.status} {dict(resp.headers)} {await resp.text()}")
    relay = {"model": "simulated/sim-1", "messages": [{"role": "user", "content": "hello"}]}
    await api("POST", "/v1/chat/completions", relay, **bearer)
    await api("POST", "/v1/chat/completions", {**relay, "model": "nowhere/m"}, **bearer)
    await api("GET", "/api/v1/tasks", Authorization=f"Bearer {key}x")  # a wrong key too
    # The key at the MCP server: a call, a tool error, a wrong key; the session is refused.
    mcp = {**bearer, "Accept": "application/json, text/event-stream"}
    assert (await api("POST", "/mcp", _rpc("list_tasks", {}), **mcp)).status == 200
    assert (await api("POST", "/mcp", _rpc("get_task", {"task_id": key}), **mcp)).status == 200
    await api("POST", "/mcp", _rpc("list_tasks", {}), **{**mcp, "Authorization": f"Bearer {key}x"})
    await api("POST", "/mcp", _rpc("list_tasks", {}), Cookie=f"{SESSION_COOKIE}={session}")

    # A provider with a canary key, called and failing (nothing listens on its port).
    provider = {
        "name": "shut",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": CANARIES["provider key"],
        "models": [{"name": "m"}],
        "timeouts": {"connect_s": 1},
    }
    assert (await api("POST", "/api/v1/providers", provider, **server.auth)).status == 201
    await api("POST", "/v1/chat/completions", {**relay, "model": "shut/m"}, **bearer)

    # A webhook agent with a canary secret whose port is closed, and a process agent with a
    # canary secret env value: both run one task.
    hook = {
        "name": "hook",
        "adapter": "http",
        "config": {"url": "http://127.0.0.1:9/hook", "secret": CANARIES["webhook secret"]},
    }
    proc = {
        "name": "proc",
        "adapter": "process",
        "config": {
            "command": [SH, "-c", 'printf "%s" "$API_TOKEN" | wc -c'],
            "secret_env": {"API_TOKEN": CANARIES["secret env"]},
        },
    }
    agents = []
    for body in (hook, proc):
        reply = await api("POST", "/api/v1/agents", body, **server.auth)
        assert reply.status == 201, reply.text
        agents.append(reply.body)
        await api("PATCH", f"/api/v1/agents/{reply.body['id']}", {"title": "T"}, **server.auth)
        await api("GET", f"/api/v1/agents/{reply.body['id']}", **server.auth)
    task_ids = []
    for agent in agents:
        task = await create_task(http, server, agent, "Run once for the sweep please")
        ended = await until_ended(http, server, task["id"])
        task_ids.append(task["id"])
        seen.append(repr(ended))
    assert ended["status"] == "done" and ended["result"].strip() == str(
        len(CANARIES["secret env"])
    ), ended  # the secret reached the command

    # Every stream, the audit log, lists and metrics.
    for task_id in task_ids:
        events = await read_events(
            http, f"{server.base_url}/api/v1/tasks/{task_id}/events", server.auth
        )
        seen.append(repr([(e.event, e.data) for e in events]))
        await api("POST", "/mcp", _rpc("get_task", {"task_id": task_id}), **mcp)
    workspace = await read_events(
        http,
        f"{server.base_url}/api/v1/events",
        {**server.auth, "Last-Event-ID": "0"},
        until=lambda got: len(got) >= 4,
    )
    seen.append(repr([(e.event, e.data) for e in workspace]))
    for path in ("/api/v1/audit-events", "/api/v1/agents", "/api/v1/providers", "/api/v1/users"):
        await api("GET", path, **server.auth)
    async with http.get(server.base_url + "/metrics", headers=server.auth) as resp:
        assert resp.status == 200
        seen.append(await resp.text())
    await asyncio.sleep(0.2)  # the relay's ledger rows commit within its linger
    async with server.services.store.read() as conn:
        for table in metadata.sorted_tables:
            for row in await conn.execute(sa.select(table)):
                seen.append(repr(dict(row._mapping)))
    logged = [caplog.text] + [repr(r.__dict__) for r in caplog.records]

    for where, text in {
        "responses, streams, rows": "\n".join(seen),
        "logs": "\n".join(logged),
    }.items():
        for name, canary in CANARIES.items():
            for form in encodings(canary):
                assert form not in text, f"the {name} leaked into {where} as {form!r}"
    # The places a secret is meant to go did carry it: the sweep could have found them.
    assert key in meant[1] and session in meant[0]


def _rpc(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A JSON-RPC `tools/call` message for `/mcp`."""
    call = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
