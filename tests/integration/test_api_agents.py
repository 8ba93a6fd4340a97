"""The agent API over a real socket, on both backends: CRUD, conflicts, validation, tenancy."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import aiohttp
import sqlalchemy as sa

from bullpen.bench.simprovider import completion_tokens
from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store.tables import agents, api_keys, audit_events, tasks
from tests.conftest import RunningServer
from tests.integration.seed import member_with_key
from tests.integration.sse import read_events, text_of

PROMPT = "Analyze this dataset and extract key metrics"
CONFIG = {"provider": "simulated", "model": "sim-1"}
PUBLIC_FIELDS = {
    "id",
    "name",
    "title",
    "adapter",
    "config",
    "status",
    "max_concurrent_runs",
    "created_at",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(
    http: aiohttp.ClientSession,
    server: RunningServer,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with http.request(
        method, server.base_url + path, json=body, headers=headers or server.auth
    ) as resp:
        raw = await resp.read()
        data = await resp.json(content_type=None) if raw else None
        return resp.status, data, resp


def assert_problem(status: int, body: Any, expected: int) -> dict[str, Any]:
    assert status == expected, body
    assert body["status"] == expected and body["detail"], body
    assert body["type"].startswith("https://bullpen.dev/problems/")
    result: dict[str, Any] = body
    return result


async def snapshot(server: RunningServer) -> tuple[list[Any], int, int]:
    """Agents, API keys and audit events: what a refused write must leave as it was."""
    async with server.services.store.read() as conn:
        agent_rows = list(await conn.execute(sa.select(agents).order_by(agents.c.id)))
        keys = (await conn.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one()
        events = (
            await conn.execute(
                sa.select(sa.func.count())
                .select_from(audit_events)
                .where(audit_events.c.action != "access.denied")
            )
        ).scalar_one()
    return [tuple(row) for row in agent_rows], int(keys), int(events)


async def audit_of(server: RunningServer, action: str) -> list[Any]:
    async with server.services.store.read() as conn:
        query = sa.select(audit_events).where(audit_events.c.action == action)
        return list(await conn.execute(query.order_by(audit_events.c.created_at)))


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
    status, agent, resp = await call(http, server, "POST", "/api/v1/agents", body, headers)
    assert status == 201, agent
    assert set(agent) == PUBLIC_FIELDS and agent["status"] == "active"
    assert agent["adapter"] == "llm" and agent["config"] == body["config"]
    assert resp.headers["Location"] == f"/api/v1/agents/{agent['id']}"
    status, again, resp = await call(http, server, "POST", "/api/v1/agents", body, headers)
    assert status == 201 and again == agent and resp.headers["Idempotent-Replayed"] == "true"

    status, listed, _ = await call(http, server, "GET", "/api/v1/agents")
    assert status == 200 and [a["name"] for a in listed["items"]] == ["analyst", "demo"]
    path = f"/api/v1/agents/{agent['id']}"
    status, got, _ = await call(http, server, "GET", path)
    assert status == 200 and got == agent

    # What the API stores is what the worker runs: the task streams with this agent's config.
    status, task, _ = await call(
        http, server, "POST", "/api/v1/tasks", {"prompt": PROMPT, "agent_id": agent["id"]}
    )
    assert status == 201, task
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
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
    status, updated, _ = await call(http, server, "PATCH", path, change)
    assert status == 200, updated
    assert {k: updated[k] for k in change} == change
    assert updated["created_at"] == agent["created_at"]
    (event,) = await audit_of(server, "agent.update")
    assert event.target_id == UUID(agent["id"])
    assert event.data["after"] == change
    assert event.data["before"] == {
        "name": "analyst",
        "title": "Data analyst",
        "config": body["config"],
        "max_concurrent_runs": 3,
        "status": "active",
    }
    status, same, _ = await call(http, server, "PATCH", path, {"title": "Senior analyst"})
    assert status == 200 and same == updated and len(await audit_of(server, "agent.update")) == 1
    status, problem, _ = await call(
        http, server, "POST", "/api/v1/tasks", {"prompt": PROMPT, "agent_id": agent["id"]}
    )
    assert "paused" in assert_problem(status, problem, 409)["detail"]

    # A fresh agent without tasks can be deleted, and its API keys go with it.
    status, spare, _ = await call(
        http, server, "POST", "/api/v1/agents", {"name": "spare", "config": CONFIG}
    )
    assert status == 201 and spare["max_concurrent_runs"] == 10 and spare["title"] == ""
    assert spare["config"] == CONFIG  # unset options are left out, not stored as null
    status, key, _ = await call(
        http, server, "POST", "/api/v1/api-keys", {"name": "bot", "agent_id": spare["id"]}
    )
    assert status == 201
    status, body_, _ = await call(http, server, "DELETE", f"/api/v1/agents/{spare['id']}")
    assert status == 204 and body_ is None
    status, problem, _ = await call(http, server, "GET", f"/api/v1/agents/{spare['id']}")
    assert_problem(status, problem, 404)
    status, problem, _ = await call(http, server, "GET", "/api/v1/tasks", None, bearer(key["key"]))
    assert_problem(status, problem, 401)
    async with server.services.store.read() as conn:
        left = await conn.execute(sa.select(api_keys.c.id).where(api_keys.c.id == UUID(key["id"])))
        assert left.first() is None

    for action in ("agent.create", "agent.delete"):
        found = await audit_of(server, action)
        assert [e.target_id for e in found][-1] == UUID(spare["id"])
    assert len(await audit_of(server, "agent.create")) == 2  # the replay wrote nothing


async def test_conflicts_are_409(server: RunningServer, http: aiohttp.ClientSession) -> None:
    status, problem, _ = await call(
        http, server, "POST", "/api/v1/agents", {"name": "demo", "config": CONFIG}
    )
    assert "demo" in assert_problem(status, problem, 409)["detail"]
    status, other, _ = await call(
        http, server, "POST", "/api/v1/agents", {"name": "other", "config": CONFIG}
    )
    assert status == 201
    before = await snapshot(server)
    status, problem, _ = await call(
        http, server, "PATCH", f"/api/v1/agents/{other['id']}", {"name": "demo"}
    )
    assert_problem(status, problem, 409)
    assert await snapshot(server) == before

    demo = f"/api/v1/agents/{server.boot.agent_id}"
    task = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    status, _, _ = await call(http, server, "POST", "/api/v1/tasks", task)
    assert status == 201
    before = await snapshot(server)
    status, problem, _ = await call(http, server, "DELETE", demo)
    assert "pause" in assert_problem(status, problem, 409)["detail"]
    assert await snapshot(server) == before
    status, _, _ = await call(http, server, "GET", demo)
    assert status == 200


BAD_BODIES: list[tuple[Any, str]] = [
    ({"config": CONFIG}, "name"),
    ({"name": "", "config": CONFIG}, "name"),
    ({"name": "n" * 101, "config": CONFIG}, "name"),
    ({"name": "-dash-first", "config": CONFIG}, "name"),
    ({"name": "semi;colon", "config": CONFIG}, "name"),
    ({"name": "a", "title": "t" * 201, "config": CONFIG}, "title"),
    ({"name": "a", "title": "bell\x07", "config": CONFIG}, "title"),
    ({"name": "a", "adapter": "http", "config": CONFIG}, "adapter"),
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
    ({"config": {"model": "m"}}, "config.provider"),
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
        other = await identity.create_workspace(
            conn, name="Other", slug="other", task_key="OT", now=now
        )
        _, their_key = await member_with_key(
            conn, other, role=Role.OWNER, secret=svc.secret, email="o@x.io", now=now
        )
        theirs = await agent_store.create_agent(
            conn, workspace_id=other, name="theirs", title="", adapter="llm", config=CONFIG, now=now
        )
    member = bearer(member_key)
    demo = f"/api/v1/agents/{server.boot.agent_id}"
    before = await snapshot(server)

    requests = (("POST", "/api/v1/agents", BAD_BODIES), ("PATCH", demo, BAD_CHANGES))
    for method, path, cases in requests:
        for body, field in cases:
            status, problem, _ = await call(http, server, method, path, body)
            problem = assert_problem(status, problem, 422)
            assert any(str(e["field"]).startswith(field) for e in problem["errors"]), (
                body,
                problem,
            )
    for raw in (b"{not json", b"[]", b"null"):
        async with http.post(
            f"{server.base_url}/api/v1/agents",
            data=raw,
            headers={**server.auth, "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 422

    status, listed, _ = await call(http, server, "GET", "/api/v1/agents", None, member)
    assert status == 200 and [a["name"] for a in listed["items"]] == ["demo"]
    status, _, _ = await call(http, server, "GET", demo, None, member)
    assert status == 200
    for method, path, body in (
        ("POST", "/api/v1/agents", {"name": "mine", "config": CONFIG}),
        ("PATCH", demo, {"status": "paused"}),
        ("DELETE", demo, None),
    ):
        status, problem, _ = await call(http, server, method, path, body, member)
        assert "agents:write" in assert_problem(status, problem, 403)["detail"]
    assert len(await audit_of(server, "access.denied")) == 3

    for method, body in (("GET", None), ("PATCH", {"title": "x"}), ("DELETE", None)):
        status, problem, _ = await call(http, server, method, f"/api/v1/agents/{theirs}", body)
        assert_problem(status, problem, 404)
        status, problem, _ = await call(http, server, method, demo, body, bearer(their_key))
        assert_problem(status, problem, 404)
    status, listed, _ = await call(http, server, "GET", "/api/v1/agents", None, bearer(their_key))
    assert [a["name"] for a in listed["items"]] == ["theirs"]
    assert await snapshot(server) == before
    async with svc.store.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(tasks))).scalar_one() == 0
