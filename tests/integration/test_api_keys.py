"""The API key API over a real socket, on both backends: shown once, stored as a digest, scoped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import aiohttp
import sqlalchemy as sa

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store.tables import api_keys, audit_events, idempotency_keys, tasks
from tests.conftest import RunningServer
from tests.integration.seed import member_with_key

PROMPT = "Analyze this dataset and extract key metrics"
PROBLEM = "application/problem+json"
PUBLIC_FIELDS = {
    "id",
    "name",
    "prefix",
    "scopes",
    "user_id",
    "agent_id",
    "created_at",
    "expires_at",
    "last_used_at",
    "revoked_at",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def call(
    http: aiohttp.ClientSession,
    server: RunningServer,
    method: str,
    path: str,
    headers: dict[str, str],
    body: Any = None,
) -> tuple[int, Any, aiohttp.ClientResponse]:
    async with http.request(method, server.base_url + path, json=body, headers=headers) as resp:
        raw = await resp.read()
        data = await resp.json(content_type=None) if raw else None
        return resp.status, data, resp


async def create_key(
    http: aiohttp.ClientSession,
    server: RunningServer,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    status, data, _ = await call(
        http, server, "POST", "/api/v1/api-keys", headers or server.auth, body
    )
    return status, data


def assert_problem(status: int, body: Any, expected: int) -> dict[str, Any]:
    assert status == expected, body
    assert body["status"] == expected and body["detail"], body
    assert body["type"].startswith("https://bullpen.dev/problems/")
    result: dict[str, Any] = body
    return result


async def rows(server: RunningServer, query: Any) -> list[Any]:
    async with server.services.store.read() as conn:
        return list(await conn.execute(query))


async def count(server: RunningServer, table: sa.Table) -> int:
    async with server.services.store.read() as conn:
        return int((await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar_one())


async def audit_actions(server: RunningServer) -> list[str]:
    found = await rows(server, sa.select(audit_events.c.action).order_by(audit_events.c.created_at))
    return [row.action for row in found]


async def add_member(server: RunningServer, role: Role, email: str) -> tuple[UUID, str]:
    svc = server.services
    async with svc.store.write() as conn:
        return await member_with_key(
            conn,
            server.boot.workspace_id,
            role=role,
            secret=svc.secret,
            email=email,
            now=svc.clock(),
        )


async def test_key_is_shown_once_and_stored_only_as_its_digest(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    status, created = await create_key(http, server, {"name": "ci", "scopes": ["tasks:read"]})
    assert status == 201, created
    key = created["key"]
    assert key.startswith("bp_") and len(key) >= 43
    assert created["prefix"] == tokens.visible_prefix(key) and created["scopes"] == ["tasks:read"]
    assert created["user_id"] and created["agent_id"] is None and created["revoked_at"] is None
    assert set(created) == PUBLIC_FIELDS | {"key"}

    status, listed, _ = await call(http, server, "GET", "/api/v1/api-keys", server.auth)
    assert status == 200 and key not in str(listed)
    mine = next(item for item in listed["items"] if item["id"] == created["id"])
    assert set(mine) == PUBLIC_FIELDS and mine["name"] == "ci"
    assert listed["items"][0]["id"] == created["id"]  # newest first
    status, got, resp = await call(
        http, server, "GET", f"/api/v1/api-keys/{created['id']}", server.auth
    )
    assert status == 200 and set(got) == PUBLIC_FIELDS and key not in await resp.text()

    (row,) = await rows(server, sa.select(api_keys).where(api_keys.c.id == UUID(created["id"])))
    assert bytes(row.digest) == tokens.digest(server.services.secret, key)
    for value in row:
        assert key not in str(value)
        if isinstance(value, bytes | memoryview):
            assert key.encode() not in bytes(value)

    status, _, _ = await call(http, server, "GET", "/api/v1/tasks", bearer(key))
    assert status == 200
    (event,) = await rows(
        server, sa.select(audit_events).where(audit_events.c.action == "api_key.create")
    )
    assert event.target_id == UUID(created["id"]) and key not in str(event.data)
    assert event.data["scopes"] == ["tasks:read"] and event.data["prefix"] == created["prefix"]

    # A replay cannot show the key again: it was never stored.
    headers = {**server.auth, "Idempotency-Key": "key-create-1"}
    body = {"name": "deploy"}
    status, first, _ = await call(http, server, "POST", "/api/v1/api-keys", headers, body)
    assert status == 201 and first["key"] and first["scopes"] == ["*"]
    status, again, resp = await call(http, server, "POST", "/api/v1/api-keys", headers, body)
    assert status == 201 and resp.headers["Idempotent-Replayed"] == "true"
    assert again["key"] is None and again["id"] == first["id"]
    assert resp.headers["Location"] == f"/api/v1/api-keys/{first['id']}"
    assert await count(server, api_keys) == 3  # the bootstrap key, `ci` and `deploy`
    (stored,) = await rows(server, sa.select(idempotency_keys.c.body))
    assert first["key"].encode() not in bytes(stored.body)


BAD_BODIES: list[tuple[Any, str]] = [
    ({"name": ""}, "name"),
    ({"name": "n" * 101}, "name"),
    ({"name": "two\nlines"}, "name"),
    ({"name": " padded"}, "name"),
    ({"name": 7}, "name"),
    ({}, "name"),
    ({"name": "x", "scopes": ["tasks:nope"]}, "scopes"),
    ({"name": "x", "scopes": ["*", "tasks:read"]}, "scopes"),
    ({"name": "x", "scopes": []}, "scopes"),
    ({"name": "x", "scopes": "*"}, "scopes"),
    ({"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
    ({"name": "x", "expires_at": "2999-01-01T00:00:00Z"}, "expires_at"),
    ({"name": "x", "expires_at": "2030-01-01T00:00:00"}, "expires_at"),
    ({"name": "x", "agent_id": "nope"}, "agent_id"),
    ({"name": "x", "user_id": "00000000-0000-4000-8000-000000000000"}, "user_id"),
    ({"name": "x", "prefix": "bp_chosen"}, "prefix"),
]


async def test_bad_input_scopes_and_no_escalation(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for body, field in BAD_BODIES:
        status, problem = await create_key(http, server, body)
        problem = assert_problem(status, problem, 422)
        assert any(str(e["field"]).startswith(field) for e in problem["errors"]), (body, problem)
    assert await count(server, api_keys) == 1
    assert await audit_actions(server) == ["instance.bootstrap"]

    # Scopes narrow what a key may do.
    _, reader = await create_key(http, server, {"name": "ro", "scopes": ["tasks:read"]})
    headers = bearer(reader["key"])
    task = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    status, _, _ = await call(http, server, "GET", "/api/v1/tasks", headers)
    assert status == 200
    status, body, _ = await call(http, server, "POST", "/api/v1/tasks", headers, task)
    assert "tasks:write" in assert_problem(status, body, 403)["detail"]
    status, body = await create_key(http, server, {"name": "x"}, headers)
    assert_problem(status, body, 403)
    assert await count(server, tasks) == 0 and await count(server, api_keys) == 2

    # No escalation: a key never grants more than its creator holds.
    _, member_key = await add_member(server, Role.MEMBER, "m@x.io")
    member = bearer(member_key)
    before = await count(server, api_keys)
    status, body = await create_key(http, server, {"name": "x", "scopes": ["agents:write"]}, member)
    assert "agents:write" in assert_problem(status, body, 403)["detail"]
    status, body = await create_key(
        http, server, {"name": "x", "agent_id": str(server.boot.agent_id)}, member
    )
    assert "keys:admin" in assert_problem(status, body, 403)["detail"]
    assert await count(server, api_keys) == before

    status, own = await create_key(http, server, {"name": "mine"}, member)
    assert status == 201 and own["scopes"] == ["*"]
    # A scoped key may mint a key as narrow as itself, never a broader one.
    scoped = ["keys:write", "tasks:read", "tasks:write"]
    _, narrow = await create_key(http, server, {"name": "narrow", "scopes": scoped}, member)
    status, body = await create_key(http, server, {"name": "x"}, bearer(narrow["key"]))
    assert "`*`" in assert_problem(status, body, 403)["detail"]
    status, body = await create_key(
        http, server, {"name": "x", "scopes": ["agents:read"]}, bearer(narrow["key"])
    )
    assert "agents:read" in assert_problem(status, body, 403)["detail"]
    status, narrower = await create_key(
        http, server, {"name": "narrower", "scopes": ["tasks:read"]}, bearer(narrow["key"])
    )
    assert status == 201 and narrower["scopes"] == ["tasks:read"]
    assert await count(server, api_keys) == before + 3


async def test_expired_and_revoked_keys_are_refused(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    expired = tokens.new_api_key()
    now = svc.clock()
    async with svc.store.write() as conn:
        owner_id = (await conn.execute(sa.select(api_keys.c.user_id).limit(1))).scalar_one()
        await identity.create_api_key(
            conn,
            workspace_id=server.boot.workspace_id,
            user_id=owner_id,
            name="old",
            prefix=tokens.visible_prefix(expired),
            digest=tokens.digest(svc.secret, expired),
            scopes=["*"],
            now=now - timedelta(days=2),
            expires_at=now - timedelta(seconds=1),
        )
    status, body, _ = await call(http, server, "GET", "/api/v1/tasks", bearer(expired))
    assert_problem(status, body, 401)

    soon = (now + timedelta(days=30)).isoformat()
    status, created = await create_key(http, server, {"name": "tmp", "expires_at": soon})
    assert status == 201 and created["expires_at"] is not None
    key = bearer(created["key"])
    path = f"/api/v1/api-keys/{created['id']}"
    status, _, _ = await call(http, server, "GET", "/api/v1/tasks", key)
    assert status == 200
    status, body, _ = await call(http, server, "DELETE", path, server.auth)
    assert status == 204 and body is None
    status, body, _ = await call(http, server, "GET", "/api/v1/tasks", key)
    assert_problem(status, body, 401)
    status, body, _ = await call(http, server, "DELETE", path, server.auth)
    assert status == 204  # revoking again is a no-op
    status, got, _ = await call(http, server, "GET", path, server.auth)
    assert status == 200 and got["revoked_at"] is not None
    actions = await audit_actions(server)
    assert actions.count("api_key.revoke") == 1 and actions.count("api_key.create") == 1

    # A key can revoke itself.
    _, selfish = await create_key(http, server, {"name": "self"})
    own = bearer(selfish["key"])
    status, _, _ = await call(http, server, "DELETE", f"/api/v1/api-keys/{selfish['id']}", own)
    assert status == 204
    status, body, _ = await call(http, server, "GET", "/api/v1/api-keys", own)
    assert_problem(status, body, 401)


async def test_who_sees_and_revokes_which_keys_and_agent_keys(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    member_key_id, member_key = await add_member(server, Role.MEMBER, "m@x.io")
    member = bearer(member_key)
    agent_id = str(server.boot.agent_id)
    status, agent_key = await create_key(http, server, {"name": "bot", "agent_id": agent_id})
    assert status == 201 and agent_key["agent_id"] == agent_id and agent_key["user_id"] is None
    status, everything, _ = await call(http, server, "GET", "/api/v1/api-keys", server.auth)
    ids = {item["id"] for item in everything["items"]}
    assert status == 200 and {str(member_key_id), agent_key["id"]} <= ids and len(ids) == 3

    # A member sees only its own keys; others' are 404 to read and to revoke.
    status, own, _ = await call(http, server, "GET", "/api/v1/api-keys", member)
    assert status == 200 and [item["id"] for item in own["items"]] == [str(member_key_id)]
    owner_key_id = next(i for i in ids if i not in {str(member_key_id), agent_key["id"]})
    for method in ("GET", "DELETE"):
        for target in (owner_key_id, agent_key["id"]):
            status, body, _ = await call(http, server, method, f"/api/v1/api-keys/{target}", member)
            assert_problem(status, body, 404)

    # An agent's key creates tasks but manages no keys.
    agent = bearer(agent_key["key"])
    task = {"prompt": PROMPT, "agent_id": agent_id}
    status, made, _ = await call(http, server, "POST", "/api/v1/tasks", agent, task)
    assert status == 201, made
    for method, path, body in (
        ("GET", "/api/v1/api-keys", None),
        ("POST", "/api/v1/api-keys", {"name": "more"}),
        ("DELETE", f"/api/v1/api-keys/{agent_key['id']}", None),
    ):
        status, problem, _ = await call(http, server, method, path, agent, body)
        assert_problem(status, problem, 403)
    status, body = await create_key(
        http, server, {"name": "x", "agent_id": agent_id, "scopes": ["keys:admin"]}
    )
    assert "keys:admin" in assert_problem(status, body, 403)["detail"]
    missing = "00000000-0000-4000-8000-000000000000"
    status, body = await create_key(http, server, {"name": "x", "agent_id": missing})
    assert_problem(status, body, 404)

    # keys:admin reaches everyone's keys.
    status, _, _ = await call(
        http, server, "DELETE", f"/api/v1/api-keys/{member_key_id}", server.auth
    )
    assert status == 204
    status, body, _ = await call(http, server, "GET", "/api/v1/api-keys", member)
    assert_problem(status, body, 401)

    # Another workspace's keys and agents are 404, even for its keys:admin.
    svc = server.services
    async with svc.store.write() as conn:
        other = await identity.create_workspace(
            conn, name="Other", slug="other", task_key="OT", now=svc.clock()
        )
        their_key_id, their_key = await member_with_key(
            conn, other, role=Role.OWNER, secret=svc.secret, email="o@x.io", now=svc.clock()
        )
        their_agent = await agent_store.create_agent(
            conn, workspace_id=other, name="t", title="", adapter="llm", config={}, now=svc.clock()
        )
    for method in ("GET", "DELETE"):
        status, body, _ = await call(
            http, server, method, f"/api/v1/api-keys/{their_key_id}", server.auth
        )
        assert_problem(status, body, 404)
        status, body, _ = await call(
            http, server, method, f"/api/v1/api-keys/{owner_key_id}", bearer(their_key)
        )
        assert_problem(status, body, 404)
    status, body = await create_key(http, server, {"name": "x", "agent_id": str(their_agent)})
    assert_problem(status, body, 404)
    status, theirs, _ = await call(http, server, "GET", "/api/v1/api-keys", bearer(their_key))
    assert [item["id"] for item in theirs["items"]] == [str(their_key_id)]
    status, _, _ = await call(http, server, "GET", "/api/v1/tasks", agent)
    assert status == 200  # every refused revoke above changed nothing
    assert await count(server, api_keys) == 4
    actions = await audit_actions(server)
    assert actions.count("api_key.create") == 1 and actions.count("api_key.revoke") == 1
