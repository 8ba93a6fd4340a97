"""The API key API over a real socket, on both backends: shown once, stored as a digest, scoped."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import aiohttp
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store.tables import agents, api_keys, audit_events, idempotency_keys, tasks
from tests.support.db import count, key_reads, rows, statements_with
from tests.support.http import Reply, bearer, call, problem
from tests.support.seed import new_member, other_workspace
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"
PUBLIC_FIELDS = {
    "id",
    "name",
    "prefix",
    "scopes",
    "workspace_id",
    "user_id",
    "agent_id",
    "created_at",
    "expires_at",
    "last_used_at",
    "revoked_at",
    "rpm_limit",
    "tpm_limit",
}


async def create_key(
    http: aiohttp.ClientSession,
    server: RunningServer,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Reply:
    return await call(http, server, "POST", "/api/v1/api-keys", headers, body)


async def audit_actions(server: RunningServer) -> list[str]:
    found = await rows(server, sa.select(audit_events.c.action).order_by(audit_events.c.created_at))
    return [row.action for row in found]


async def test_key_is_shown_once_and_stored_only_as_its_digest(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    reply = await create_key(http, server, {"name": "ci", "scopes": ["tasks:read"]})
    assert reply.status == 201, reply.body
    created = reply.body
    key = created["key"]
    assert key.startswith("bp_") and len(key) >= 43
    assert created["prefix"] == tokens.visible_prefix(key) and created["scopes"] == ["tasks:read"]
    assert created["user_id"] and created["agent_id"] is None and created["revoked_at"] is None
    assert set(created) == PUBLIC_FIELDS | {"key"}

    listed = await call(http, server, "GET", "/api/v1/api-keys", server.auth)
    assert listed.status == 200 and key not in str(listed.body)
    mine = next(item for item in listed.body["items"] if item["id"] == created["id"])
    assert set(mine) == PUBLIC_FIELDS and mine["name"] == "ci"
    assert listed.body["items"][0]["id"] == created["id"]  # newest first
    got = await call(http, server, "GET", f"/api/v1/api-keys/{created['id']}", server.auth)
    assert got.status == 200 and set(got.body) == PUBLIC_FIELDS and key not in got.text

    (row,) = await rows(server, sa.select(api_keys).where(api_keys.c.id == UUID(created["id"])))
    assert bytes(row.digest) == tokens.digest(server.services.secret, key)
    for value in row:
        assert key not in str(value)
        if isinstance(value, bytes | memoryview):
            assert key.encode() not in bytes(value)

    assert (await call(http, server, "GET", "/api/v1/tasks", bearer(key))).status == 200
    (event,) = await rows(
        server, sa.select(audit_events).where(audit_events.c.action == "api_key.create")
    )
    assert event.target_id == UUID(created["id"]) and key not in str(event.data)
    assert event.data["scopes"] == ["tasks:read"] and event.data["prefix"] == created["prefix"]

    # A replay cannot show the key again: it was never stored.
    headers = {**server.auth, "Idempotency-Key": "key-create-1"}
    body = {"name": "deploy"}
    first = await call(http, server, "POST", "/api/v1/api-keys", headers, body)
    assert first.status == 201 and first.body["key"] and first.body["scopes"] == ["*"]
    again = await call(http, server, "POST", "/api/v1/api-keys", headers, body)
    assert again.status == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.body["key"] is None and again.body["id"] == first.body["id"]
    assert again.headers["Location"] == f"/api/v1/api-keys/{first.body['id']}"
    assert await count(server, api_keys) == 3  # the bootstrap key, `ci` and `deploy`
    (stored,) = await rows(server, sa.select(idempotency_keys.c.body))
    assert first.body["key"].encode() not in bytes(stored.body)


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
        refused = problem(await create_key(http, server, body), 422)
        assert any(str(e["field"]).startswith(field) for e in refused["errors"]), (body, refused)
    assert await count(server, api_keys) == 1
    assert await audit_actions(server) == ["instance.bootstrap"]

    # Scopes narrow what a key may do.
    reader = (await create_key(http, server, {"name": "ro", "scopes": ["tasks:read"]})).body
    headers = bearer(reader["key"])
    task = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    assert (await call(http, server, "GET", "/api/v1/tasks", headers)).status == 200
    reply = await call(http, server, "POST", "/api/v1/tasks", headers, task)
    assert "tasks:write" in problem(reply, 403)["detail"]
    problem(await create_key(http, server, {"name": "x"}, headers), 403)
    assert await count(server, tasks) == 0 and await count(server, api_keys) == 2

    # No escalation: a key never grants more than its creator holds.
    member = bearer((await new_member(server, Role.MEMBER, "m@x.io")).key)
    before = await count(server, api_keys)
    reply = await create_key(http, server, {"name": "x", "scopes": ["agents:write"]}, member)
    assert "agents:write" in problem(reply, 403)["detail"]
    reply = await create_key(
        http, server, {"name": "x", "agent_id": str(server.boot.agent_id)}, member
    )
    assert "keys:admin" in problem(reply, 403)["detail"]
    assert await count(server, api_keys) == before

    own = await create_key(http, server, {"name": "mine"}, member)
    assert own.status == 201 and own.body["scopes"] == ["*"]
    # A scoped key may mint a key as narrow as itself, never a broader one.
    scoped = ["keys:write", "tasks:read", "tasks:write"]
    narrow = (await create_key(http, server, {"name": "narrow", "scopes": scoped}, member)).body
    reply = await create_key(http, server, {"name": "x"}, bearer(narrow["key"]))
    assert "`*`" in problem(reply, 403)["detail"]
    reply = await create_key(
        http, server, {"name": "x", "scopes": ["agents:read"]}, bearer(narrow["key"])
    )
    assert "agents:read" in problem(reply, 403)["detail"]
    narrower = await create_key(
        http, server, {"name": "narrower", "scopes": ["tasks:read"]}, bearer(narrow["key"])
    )
    assert narrower.status == 201 and narrower.body["scopes"] == ["tasks:read"]
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
    problem(await call(http, server, "GET", "/api/v1/tasks", bearer(expired)), 401)

    soon = (now + timedelta(days=30)).isoformat()
    reply = await create_key(http, server, {"name": "tmp", "expires_at": soon})
    assert reply.status == 201 and reply.body["expires_at"] is not None
    created = reply.body
    key = bearer(created["key"])
    path = f"/api/v1/api-keys/{created['id']}"
    assert (await call(http, server, "GET", "/api/v1/tasks", key)).status == 200
    revoked = await call(http, server, "DELETE", path, server.auth)
    assert revoked.status == 204 and revoked.body is None
    problem(await call(http, server, "GET", "/api/v1/tasks", key), 401)
    again = await call(http, server, "DELETE", path, server.auth)
    assert again.status == 204  # revoking again is a no-op
    got = await call(http, server, "GET", path, server.auth)
    assert got.status == 200 and got.body["revoked_at"] is not None
    actions = await audit_actions(server)
    assert actions.count("api_key.revoke") == 1 and actions.count("api_key.create") == 1

    # A key can revoke itself.
    selfish = (await create_key(http, server, {"name": "self"})).body
    own = bearer(selfish["key"])
    gone = await call(http, server, "DELETE", f"/api/v1/api-keys/{selfish['id']}", own)
    assert gone.status == 204
    problem(await call(http, server, "GET", "/api/v1/api-keys", own), 401)


async def test_who_sees_and_revokes_which_keys_and_agent_keys(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    _, member_key_id, member_key = await new_member(server, Role.MEMBER, "m@x.io")
    member = bearer(member_key)
    agent_id = str(server.boot.agent_id)
    reply = await create_key(http, server, {"name": "bot", "agent_id": agent_id})
    agent_key = reply.body
    assert reply.status == 201
    assert agent_key["agent_id"] == agent_id and agent_key["user_id"] is None
    everything = await call(http, server, "GET", "/api/v1/api-keys", server.auth)
    ids = {item["id"] for item in everything.body["items"]}
    assert everything.status == 200
    assert {str(member_key_id), agent_key["id"]} <= ids and len(ids) == 3

    # A member sees only its own keys; others' are 404 to read and to revoke.
    own = await call(http, server, "GET", "/api/v1/api-keys", member)
    assert own.status == 200 and [item["id"] for item in own.body["items"]] == [str(member_key_id)]
    owner_key_id = next(i for i in ids if i not in {str(member_key_id), agent_key["id"]})
    for method in ("GET", "DELETE"):
        for target in (owner_key_id, agent_key["id"]):
            problem(await call(http, server, method, f"/api/v1/api-keys/{target}", member), 404)

    # An agent's key creates tasks but manages no keys.
    agent = bearer(agent_key["key"])
    task = {"prompt": PROMPT, "agent_id": agent_id}
    made = await call(http, server, "POST", "/api/v1/tasks", agent, task)
    assert made.status == 201, made.body
    for method, path, body in (
        ("GET", "/api/v1/api-keys", None),
        ("POST", "/api/v1/api-keys", {"name": "more"}),
        ("DELETE", f"/api/v1/api-keys/{agent_key['id']}", None),
    ):
        problem(await call(http, server, method, path, agent, body), 403)
    reply = await create_key(
        http, server, {"name": "x", "agent_id": agent_id, "scopes": ["keys:admin"]}
    )
    assert "keys:admin" in problem(reply, 403)["detail"]
    missing = "00000000-0000-4000-8000-000000000000"
    problem(await create_key(http, server, {"name": "x", "agent_id": missing}), 404)

    # keys:admin reaches everyone's keys.
    path = f"/api/v1/api-keys/{member_key_id}"
    assert (await call(http, server, "DELETE", path, server.auth)).status == 204
    problem(await call(http, server, "GET", "/api/v1/api-keys", member), 401)

    # Another workspace's keys and agents are 404, even for its keys:admin.
    svc = server.services
    async with svc.store.write() as conn:
        other, their_key_id, their_key = await other_workspace(
            conn, secret=svc.secret, now=svc.clock()
        )
        their_agent = await agent_store.create_agent(
            conn, workspace_id=other, name="t", title="", adapter="llm", config={}, now=svc.clock()
        )
    for method in ("GET", "DELETE"):
        path = f"/api/v1/api-keys/{their_key_id}"
        problem(await call(http, server, method, path, server.auth), 404)
        path = f"/api/v1/api-keys/{owner_key_id}"
        problem(await call(http, server, method, path, bearer(their_key)), 404)
    problem(await create_key(http, server, {"name": "x", "agent_id": str(their_agent)}), 404)
    theirs = await call(http, server, "GET", "/api/v1/api-keys", bearer(their_key))
    assert [item["id"] for item in theirs.body["items"]] == [str(their_key_id)]
    still = await call(http, server, "GET", "/api/v1/tasks", agent)
    assert still.status == 200  # every refused revoke above changed nothing
    assert await count(server, api_keys) == 4
    actions = await audit_actions(server)
    assert actions.count("api_key.create") == 1 and actions.count("api_key.revoke") == 1


@pytest.mark.with_settings(api_key_cache_s=1.0)
async def test_key_changes_apply_here_at_once_and_from_other_processes_within_the_cache_time(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    member = await new_member(server, Role.MEMBER, "cached@example.com")
    key = bearer(member.key)
    create = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    assert (await call(http, server, "GET", "/api/v1/tasks", key)).status == 200  # cached now

    # This process demotes the member: the next request already acts as a viewer.
    path = f"/api/v1/members/{member.user_id}"
    assert (await call(http, server, "PATCH", path, server.auth, {"role": "viewer"})).status == 200
    problem(await call(http, server, "POST", "/api/v1/tasks", key, create), 403)

    # Another process (its own connection to the database) revokes the key: this one, which
    # read the key a moment ago, honours it at most `api_key_cache_s` longer. The other
    # connection is made first, so that the cache's second is not spent connecting.
    revoke = (
        api_keys.update()
        .where(api_keys.c.id == member.key_id)
        .values(revoked_at=server.services.clock())
    )
    async with another_process(server) as run_there:
        assert (await call(http, server, "GET", "/api/v1/tasks", key)).status == 200
        await run_there(revoke)
    assert (await call(http, server, "GET", "/api/v1/tasks", key)).status == 200
    await asyncio.sleep(1.1)
    problem(await call(http, server, "GET", "/api/v1/tasks", key), 401)


@pytest.mark.with_settings(api_key_cache_s=30.0, worker_enabled=False)
async def test_creating_tasks_keeps_the_key_cached(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """A create writes the workspace's task number: that must not empty the key cache (on
    SQLite the number is a counter on the workspace row, one of the key's source tables)."""
    with key_reads(server) as lookups:
        create = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
        for _ in range(5):
            reply = await call(http, server, "POST", "/api/v1/tasks", server.auth, create)
            assert reply.status == 201, reply.body
    # The first request reads the key, and records its use (a write of the key's row, so read
    # again by the next one); the others find it cached.
    assert len(lookups) <= 2, lookups


@pytest.mark.with_settings(api_key_cache_s=30.0, worker_enabled=False)
async def test_requests_missing_the_key_cache_together_read_the_key_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """When a key's entry has lapsed, every request with it in flight missed the cache and
    read the key again; now they wait for one read."""
    assert (await call(http, server, "GET", "/api/v1/tasks", server.auth)).status == 200
    server.services.auth._forget_keys()  # as when the entry lapses
    with key_reads(server) as lookups:
        replies = await asyncio.gather(
            *(call(http, server, "GET", "/api/v1/tasks", server.auth) for _ in range(20))
        )
    assert [reply.status for reply in replies] == [200] * 20
    assert len(lookups) == 1, lookups


@pytest.mark.with_settings(api_key_cache_s=30.0, worker_enabled=False)
async def test_a_burst_of_requests_on_a_key_writes_its_last_use_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """Every request in flight saw the key's `last_used_at` as due, so each wrote it, taking
    a connection and waiting on the key's row for the others; now the first one writes it."""
    async with server.services.store.write() as conn:
        await conn.execute(api_keys.update().values(last_used_at=None))
    with statements_with(server, "UPDATE api_keys SET last_used_at") as touches:
        replies = await asyncio.gather(
            *(call(http, server, "GET", "/api/v1/tasks", server.auth) for _ in range(20))
        )
        assert [reply.status for reply in replies] == [200] * 20
        assert (await call(http, server, "GET", "/api/v1/tasks", server.auth)).status == 200
    assert len(touches) == 1, touches
    used = await rows(server, sa.select(api_keys.c.last_used_at))
    assert sum(row.last_used_at is not None for row in used) == 1  # the key the burst used


async def from_another_process(server: RunningServer, statement: Any) -> None:
    """Run `statement` on a connection of its own, as another process would: this process
    hears nothing of it (its caches are not told)."""
    async with another_process(server) as run_there:
        await run_there(statement)


@contextlib.asynccontextmanager
async def another_process(
    server: RunningServer,
) -> AsyncIterator[Callable[[Any], Awaitable[None]]]:
    """A connection of its own to the server's database, made on entry; what it yields runs
    a statement there in a transaction of its own, as another process would."""
    engine = server.services.store.engine
    url = engine.url.render_as_string(hide_password=False)
    if isinstance(engine, sa.Engine):
        other = sa.create_engine(url)
        with other.connect() as sync_conn:

            async def run_sync(statement: Any) -> None:
                with sync_conn.begin():
                    sync_conn.execute(statement)

            yield run_sync
        other.dispose()
    else:
        other_async = create_async_engine(url)
        async with other_async.connect() as conn:

            async def run_async(statement: Any) -> None:
                async with conn.begin():
                    await conn.execute(statement)

            yield run_async
        await other_async.dispose()


RELAYED = {"model": "simulated/sim-1", "messages": [{"role": "user", "content": "Hello there"}]}


# Issue 19, finding 5: a terminated agent's key kept working (tasks 201, relay 200).
async def test_a_terminated_agents_keys_stop_working_at_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    agent_id = str(server.boot.agent_id)
    other = await call(
        http,
        server,
        "POST",
        "/api/v1/agents",
        body={"name": "other", "config": {"provider": "simulated", "model": "sim-1"}},
    )
    assert other.status == 201, other.text
    made = [
        await create_key(http, server, {"name": f"bot{i}", "agent_id": agent_id}) for i in (1, 2)
    ]
    agent = bearer(made[0].body["key"])
    task = {"prompt": PROMPT, "agent_id": other.body["id"]}
    assert (await call(http, server, "POST", "/api/v1/tasks", agent, task)).status == 201
    assert (await call(http, server, "POST", "/v1/chat/completions", agent, RELAYED)).status == 200

    path = f"/api/v1/agents/{agent_id}/terminate"
    assert (await call(http, server, "POST", path)).status == 200
    for key in made:
        who = bearer(key.body["key"])
        problem(await call(http, server, "GET", "/api/v1/tasks", who), 401)
        problem(await call(http, server, "POST", "/api/v1/tasks", who, task), 401)
        problem(await call(http, server, "POST", "/v1/chat/completions", who, RELAYED), 401)
        problem(await call(http, server, "GET", "/v1/models", who), 401)
    # Revoked in the terminating transaction, each revocation audited.
    revoked = await rows(server, sa.select(api_keys).where(api_keys.c.agent_id == UUID(agent_id)))
    assert len(revoked) == 2 and all(row.revoked_at is not None for row in revoked)
    assert (await audit_actions(server)).count("api_key.revoke") == 2
    # No new key for it either.
    problem(await create_key(http, server, {"name": "late", "agent_id": agent_id}), 409)


@pytest.mark.with_settings(api_key_cache_s=0.5)
async def test_a_key_of_a_terminated_agent_is_refused_even_if_not_revoked(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # A key that escaped revocation (created in a race with the termination, or terminated by
    # another process while this one holds the key in its cache) is refused all the same.
    made = await create_key(http, server, {"name": "bot", "agent_id": str(server.boot.agent_id)})
    agent = bearer(made.body["key"])
    assert (await call(http, server, "GET", "/api/v1/tasks", agent)).status == 200  # cached now
    terminate = (
        agents.update().where(agents.c.id == server.boot.agent_id).values(status="terminated")
    )
    await from_another_process(server, terminate)
    await asyncio.sleep(0.6)  # this process's cache of the key has lapsed
    problem(await call(http, server, "GET", "/api/v1/tasks", agent), 401)
    problem(await call(http, server, "POST", "/v1/chat/completions", agent, RELAYED), 401)
    [row] = await rows(server, sa.select(api_keys).where(api_keys.c.id == UUID(made.body["id"])))
    assert row.revoked_at is None
