"""The agent API over a real socket, on both backends: CRUD, conflicts, validation, tenancy."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import aiohttp
import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.simulator.provider import completion_tokens
from bullpen.store import agents as agent_store
from bullpen.store.tables import agents, api_keys, audit_events, tasks
from tests.support.db import audits, count, rows
from tests.support.http import bearer, call, problem, problem_of
from tests.support.seed import member_with_key, other_workspace
from tests.support.servers import RunningServer
from tests.support.sse import read_events, text_of

PROMPT = "Analyze this dataset and extract key metrics"
CONFIG = {"provider": "simulated", "model": "sim-1"}
PUBLIC_FIELDS = {
    "id",
    "requires_approval",
    "approval_ttl_s",
    "approval_default",
    "name",
    "description",
    "reports_to",
    "title",
    "adapter",
    "config",
    "status",
    "max_concurrent_runs",
    "created_at",
    "breakers",
    "breaker_limits",
    "paused_reason",
}


async def snapshot(server: RunningServer) -> tuple[list[Any], int, int]:
    """Agents, API keys and audit events: what a refused write must leave as it was."""
    agent_rows = await rows(server, sa.select(agents).order_by(agents.c.id))
    keys = await count(server, api_keys)
    events = await count(server, audit_events, audit_events.c.action != "access.denied")
    return [tuple(row) for row in agent_rows], keys, events


async def test_create_read_update_delete(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {
        "name": "analyst",
        "title": "Data analyst",
        "config": {**CONFIG, "system_prompt": "You count things.\nBriefly.", "max_tokens": 5},
        "max_concurrent_runs": 3,
    }
    headers = {**server.auth, "Idempotency-Key": "agent-1"}
    created = await call(http, server, "POST", "/api/v1/agents", headers, body)
    agent = created.body
    assert created.status == 201, agent
    assert set(agent) == PUBLIC_FIELDS and agent["status"] == "active"
    assert agent["adapter"] == "llm" and agent["config"] == body["config"]
    assert created.headers["Location"] == f"/api/v1/agents/{agent['id']}"
    again = await call(http, server, "POST", "/api/v1/agents", headers, body)
    assert again.status == 201 and again.body == agent
    assert again.headers["Idempotent-Replayed"] == "true"

    listed = await call(http, server, "GET", "/api/v1/agents")
    assert listed.status == 200 and [a["name"] for a in listed.body["items"]] == ["analyst", "demo"]
    path = f"/api/v1/agents/{agent['id']}"
    got = await call(http, server, "GET", path)
    assert got.status == 200 and got.body == agent

    # What the API stores is what the worker runs: the task streams with this agent's config.
    task = await call(
        http, server, "POST", "/api/v1/tasks", body={"prompt": PROMPT, "agent_id": agent["id"]}
    )
    assert task.status == 201, task.body
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task.body['id']}/events", server.auth
    )
    messages = [
        {"role": "system", "content": body["config"]["system_prompt"]},
        {"role": "user", "content": PROMPT},
    ]
    assert events[-1].data == {"status": "done"}
    assert text_of(events) == "".join(completion_tokens(messages, 5))

    change = {
        "name": "analyst 2",
        "title": "Senior analyst",
        "config": CONFIG,
        "max_concurrent_runs": 1,
        "status": "paused",
    }
    reply = await call(http, server, "PATCH", path, body=change)
    updated = reply.body
    assert reply.status == 200, updated
    assert {k: updated[k] for k in change} == change
    assert updated["created_at"] == agent["created_at"]
    (event,) = await audits(server, "agent.update")
    assert event.target_id == UUID(agent["id"])
    assert event.data["after"] == change
    assert event.data["before"] == {
        "name": "analyst",
        "title": "Data analyst",
        "config": body["config"],
        "max_concurrent_runs": 3,
        "status": "active",
    }
    same = await call(http, server, "PATCH", path, body={"title": "Senior analyst"})
    assert same.status == 200 and same.body == updated
    assert len(await audits(server, "agent.update")) == 1
    reply = await call(
        http, server, "POST", "/api/v1/tasks", body={"prompt": PROMPT, "agent_id": agent["id"]}
    )
    assert "paused" in problem(reply, 409)["detail"]

    # A fresh agent without tasks can be deleted, and its API keys go with it.
    reply = await call(
        http, server, "POST", "/api/v1/agents", body={"name": "spare", "config": CONFIG}
    )
    spare = reply.body
    assert reply.status == 201 and spare["max_concurrent_runs"] == 10 and spare["title"] == ""
    assert spare["config"] == CONFIG  # unset options are left out, not stored as null
    reply = await call(
        http, server, "POST", "/api/v1/api-keys", body={"name": "bot", "agent_id": spare["id"]}
    )
    assert reply.status == 201
    key = reply.body
    deleted = await call(http, server, "DELETE", f"/api/v1/agents/{spare['id']}")
    assert deleted.status == 204 and deleted.body is None
    problem(await call(http, server, "GET", f"/api/v1/agents/{spare['id']}"), 404)
    problem(await call(http, server, "GET", "/api/v1/tasks", bearer(key["key"])), 401)
    async with server.services.store.read() as conn:
        left = await conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == UUID(key["id"])))
        assert left.first() is None

    for action in ("agent.create", "agent.delete"):
        found = await audits(server, action)
        assert [e.target_id for e in found][-1] == UUID(spare["id"])
    assert len(await audits(server, "agent.create")) == 2  # the replay wrote nothing


async def test_conflicts_are_409(server: RunningServer, http: aiohttp.ClientSession) -> None:
    reply = await call(
        http, server, "POST", "/api/v1/agents", body={"name": "demo", "config": CONFIG}
    )
    assert "demo" in problem(reply, 409)["detail"]
    other = await call(
        http, server, "POST", "/api/v1/agents", body={"name": "other", "config": CONFIG}
    )
    assert other.status == 201
    before = await snapshot(server)
    reply = await call(
        http, server, "PATCH", f"/api/v1/agents/{other.body['id']}", body={"name": "demo"}
    )
    problem(reply, 409)
    assert await snapshot(server) == before

    demo = f"/api/v1/agents/{server.boot.agent_id}"
    task = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    assert (await call(http, server, "POST", "/api/v1/tasks", body=task)).status == 201
    before = await snapshot(server)
    assert "pause" in problem(await call(http, server, "DELETE", demo), 409)["detail"]
    assert await snapshot(server) == before
    assert (await call(http, server, "GET", demo)).status == 200


BAD_BODIES: list[tuple[Any, str]] = [
    ({"config": CONFIG}, "name"),
    ({"name": "", "config": CONFIG}, "name"),
    ({"name": "n" * 101, "config": CONFIG}, "name"),
    ({"name": "-dash-first", "config": CONFIG}, "name"),
    ({"name": "semi;colon", "config": CONFIG}, "name"),
    ({"name": "a", "title": "t" * 201, "config": CONFIG}, "title"),
    ({"name": "a", "title": "bell\x07", "config": CONFIG}, "title"),
    ({"name": "a", "adapter": "http", "config": CONFIG}, "config.url"),
    ({"name": "a", "adapter": "bogus", "config": CONFIG}, "adapter"),
    ({"name": "a"}, "config"),
    ({"name": "a", "config": {"provider": "simulated"}}, "config.model"),
    ({"name": "a", "config": {**CONFIG, "api_key": "sk-x"}}, "config.api_key"),
    ({"name": "a", "config": {**CONFIG, "provider": ""}}, "config.provider"),
    ({"name": "a", "config": {**CONFIG, "system_prompt": "s" * 20_001}}, "config.system_prompt"),
    ({"name": "a", "config": {**CONFIG, "system_prompt": "nul\x00"}}, "config.system_prompt"),
    ({"name": "a", "config": {**CONFIG, "max_tokens": 0}}, "config.max_tokens"),
    ({"name": "a", "config": CONFIG, "max_concurrent_runs": 0}, "max_concurrent_runs"),
    ({"name": "a", "config": CONFIG, "max_concurrent_runs": 1001}, "max_concurrent_runs"),
    ({"name": "a", "config": CONFIG, "max_concurrent_runs": "5"}, "max_concurrent_runs"),
    ({"name": "a", "config": CONFIG, "status": "terminated"}, "status"),
    ({"name": "a", "config": CONFIG, "workspace_id": str(UUID(int=1))}, "workspace_id"),
    ({"name": "a", "config": CONFIG, "id": str(UUID(int=1))}, "id"),
]
BAD_CHANGES: list[tuple[Any, str]] = [
    ({"name": None}, "name"),
    ({"status": None}, "status"),
    ({"status": "terminated"}, "status"),
    ({"adapter": "llm"}, "adapter"),
    ({"name": "bad/name"}, "name"),
    ({"config": {"provider": "simulated"}}, "config.model"),
    ({"max_concurrent_runs": 0}, "max_concurrent_runs"),
    ({"created_at": "2020-01-01T00:00:00Z"}, "created_at"),
]


async def test_bad_input_permissions_and_other_workspaces(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    now = svc.clock()
    async with svc.store.write() as conn:
        ws = server.boot.workspace_id
        _, member_key = await member_with_key(
            conn, ws, role=Role.MEMBER, secret=svc.secret, email="m@x.io", now=now
        )
        other, _, their_key = await other_workspace(conn, secret=svc.secret, now=now)
        theirs = await agent_store.create_agent(
            conn, workspace_id=other, name="theirs", title="", adapter="llm", config=CONFIG, now=now
        )
    member = bearer(member_key)
    demo = f"/api/v1/agents/{server.boot.agent_id}"
    before = await snapshot(server)

    requests = (("POST", "/api/v1/agents", BAD_BODIES), ("PATCH", demo, BAD_CHANGES))
    for method, path, cases in requests:
        for body, field in cases:
            refused = problem(await call(http, server, method, path, body=body), 422)
            assert any(str(e["field"]).startswith(field) for e in refused["errors"]), (
                body,
                refused,
            )
    for raw in (b"{not json", b"[]", b"null"):
        async with http.post(
            f"{server.base_url}/api/v1/agents",
            data=raw,
            headers={**server.auth, "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 422

    listed = await call(http, server, "GET", "/api/v1/agents", member)
    assert listed.status == 200 and [a["name"] for a in listed.body["items"]] == ["demo"]
    assert (await call(http, server, "GET", demo, member)).status == 200
    for method, path, body in (
        ("POST", "/api/v1/agents", {"name": "mine", "config": CONFIG}),
        ("PATCH", demo, {"status": "paused"}),
        ("DELETE", demo, None),
    ):
        reply = await call(http, server, method, path, member, body)
        assert "agents:write" in problem(reply, 403)["detail"]
    assert len(await audits(server, "access.denied")) == 3

    for method, body in (("GET", None), ("PATCH", {"title": "x"}), ("DELETE", None)):
        path = f"/api/v1/agents/{theirs}"
        problem(await call(http, server, method, path, body=body), 404)
        problem(await call(http, server, method, demo, bearer(their_key), body), 404)
    listed = await call(http, server, "GET", "/api/v1/agents", bearer(their_key))
    assert [a["name"] for a in listed.body["items"]] == ["theirs"]
    assert await snapshot(server) == before
    assert await count(server, tasks) == 0


async def test_a_json_body_escaping_a_lone_surrogate_is_422_not_500(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """Python's JSON parser takes `"\\ud800"` into a str no UTF-8 encoder accepts: the body is
    refused before any handler runs (schemathesis found a 500 when such a string reached an
    http agent's secret). A surrogate pair, an escaped emoji, is text like any other."""

    def body(secret_tail: str) -> bytes:
        text = (
            '{"name": "hook", "adapter": "http", "config": {"url": "https://example.com/hook", '
            f'"secret": "0123456789abcdef{secret_tail}"}}}}'  # pragma: allowlist secret
        )
        return text.encode()

    headers = {**server.auth, "Content-Type": "application/json"}
    for tail in ("\\ud800", "\\uDC00x", "\\ud83d"):
        async with http.post(
            f"{server.base_url}/api/v1/agents", data=body(tail), headers=headers
        ) as resp:
            found = await problem_of(resp, 422)
        assert found["errors"][0]["code"] == "json_invalid", found
    assert await count(server, agents, agents.c.name == "hook") == 0
    # The same on the direct create path (pydantic's own JSON parser refuses it).
    task = (
        b'{"prompt": "half \\ud800 of a pair", "agent_id": "'
        + str(server.boot.agent_id).encode()
        + b'"}'
    )
    async with http.post(f"{server.base_url}/api/v1/tasks", data=task, headers=headers) as resp:
        await problem_of(resp, 422)
    async with http.post(
        f"{server.base_url}/api/v1/agents", data=body("\\ud83d\\ude00"), headers=headers
    ) as resp:
        assert resp.status == 201, await resp.text()


async def test_an_http_agent_secret_with_nul_is_422_not_500(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """PostgreSQL's jsonb cannot hold NUL, and the config keeps a hint of the secret: the
    fuzzer's secret with one in it was a 500 there. It is refused, without quoting it."""
    # Its hint (the last four characters) holds the NUL.
    secret = "0123456789abcdef\x00"  # pragma: allowlist secret
    body = {
        "name": "nul-hook",
        "adapter": "http",
        "config": {"url": "https://example.com/hook", "secret": secret},
    }
    reply = await call(http, server, "POST", "/api/v1/agents", None, body)
    found = problem(reply, 422)
    assert found["errors"][0]["field"] == "config.secret", found
    assert "0123456789" not in reply.text
    assert await count(server, agents, agents.c.name == "nul-hook") == 0
