"""Idempotency-Key on creates (TEST-PLAN ID-1..ID-5), over a real socket on both backends."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import timedelta
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
import sqlalchemy as sa
from multidict import CIMultiDict

from bullpen.domain.principal import Role
from bullpen.store.tables import idempotency_keys, tasks
from tests.support.db import count
from tests.support.http import PROBLEM, bearer, problem_of
from tests.support.seed import new_member
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"


def body(server: RunningServer, prompt: str = PROMPT) -> dict[str, Any]:
    return {"prompt": prompt, "agent_id": str(server.boot.agent_id)}


async def post(
    http: aiohttp.ClientSession,
    server: RunningServer,
    payload: Any,
    key: str | None,
    auth: dict[str, str] | None = None,
) -> tuple[int, CIMultiDict[str], bytes]:
    headers = dict(auth or server.auth)
    if key is not None:
        headers["Idempotency-Key"] = key
    async with http.post(f"{server.base_url}/api/v1/tasks", json=payload, headers=headers) as r:
        return r.status, r.headers.copy(), await r.read()


async def test_replay_returns_the_stored_response(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """ID-1: five sends, one task, identical status and body, replays marked."""
    key = str(uuid.uuid4())
    answers = [await post(http, server, body(server), key) for _ in range(5)]
    assert {status for status, _, _ in answers} == {201}
    assert len({raw for _, _, raw in answers}) == 1
    assert "Idempotent-Replayed" not in answers[0][1]
    assert all(h["Idempotent-Replayed"] == "true" for _, h, _ in answers[1:])
    assert {h["Location"] for _, h, _ in answers} == {answers[0][1]["Location"]}
    assert await count(server, tasks) == 1


async def test_same_key_with_another_body_is_422(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """ID-2: a mismatch is refused with its own problem type and creates nothing."""
    key = "order-1"
    assert (await post(http, server, body(server), key))[0] == 201
    status, headers, raw = await post(http, server, body(server, PROMPT + "!"), key)
    assert status == 422 and headers["Content-Type"] == PROBLEM
    assert b"/problems/idempotency-key-mismatch" in raw
    # Key order and whitespace do not change the fingerprint: same JSON, same request.
    same = {"agent_id": str(server.boot.agent_id), "prompt": PROMPT}
    assert (await post(http, server, same, key))[0] == 201
    assert await count(server, tasks) == 1


async def test_concurrent_duplicates_create_exactly_one_task(
    server: RunningServer, http: aiohttp.ClientSession, backend: str
) -> None:
    """ID-3: 50 identical POSTs at once while the first is held in its transaction. Each
    duplicate waits for the first to end, rolls its own work back and replays the first."""
    key = str(uuid.uuid4())
    holder = None
    if backend == "postgres":
        # Hold the workspace's counter row so every request stalls inside its transaction for
        # half a second, as a slow handler would.
        holder = await asyncpg.connect(server.settings.database_url.replace("+asyncpg", ""))
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM workspaces FOR UPDATE")

    async def release() -> None:
        if holder is not None:
            await asyncio.sleep(0.5)
            await holder.execute("COMMIT")
            await holder.close()

    answers, _ = await asyncio.gather(
        asyncio.gather(*(post(http, server, body(server), key) for _ in range(50))), release()
    )
    assert [status for status, _, _ in answers] == [201] * 50
    firsts = [raw for _, headers, raw in answers if "Idempotent-Replayed" not in headers]
    assert len(firsts) == 1  # one request created the task; 49 replayed it
    assert {raw for _, _, raw in answers} == set(firsts)
    assert await count(server, tasks) == 1
    # Nothing was left half-done by the 49 rolled-back creates: the next task is number 2.
    prefix, number = orjson.loads(firsts[0])["number"].rsplit("-", 1)
    fresh = await post(http, server, body(server), None)
    assert number == "1" and (fresh[0], orjson.loads(fresh[2])["number"]) == (201, f"{prefix}-2")


async def test_an_outcome_committed_while_the_request_runs_wins(
    server: RunningServer, http: aiohttp.ClientSession, backend: str
) -> None:
    """Another transaction commits an outcome for the key while the request is inside its own:
    the request's insert of the key finds it taken, so it rolls back its task and replays the
    committed outcome."""
    if backend != "postgres":
        pytest.skip("SQLite's single writer runs no transaction beside the request's")
    assert (await post(http, server, body(server), "probe"))[0] == 201
    async with server.services.store.read() as conn:
        probe = (await conn.execute(sa.select(idempotency_keys))).one()
    dsn = server.settings.database_url.replace("+asyncpg", "")
    holder, other = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        # Stall the request inside its transaction (at its task's foreign key to the agent,
        # which a row lock FOR UPDATE holds back; the other insert has no key to the agent)...
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM agents FOR UPDATE")
        racing = asyncio.create_task(post(http, server, body(server), "raced"))
        await asyncio.sleep(0.5)
        # ...while another transaction commits an outcome for the same key.
        first = orjson.dumps({"first": True})
        fingerprint = hashlib.sha256(
            orjson.dumps(body(server), option=orjson.OPT_SORT_KEYS)
        ).digest()
        await other.execute(
            "INSERT INTO idempotency_keys (workspace_id, principal, route, key, fingerprint,"
            " status_code, headers, body, created_at, expires_at)"
            " VALUES ($1, $2, $3, 'raced', $4, 201, '{}', $5, $6, $7)",
            probe.workspace_id,
            probe.principal,
            probe.route,
            fingerprint,
            first,
            probe.created_at,
            probe.expires_at,
        )
        await holder.execute("COMMIT")
        status, headers, raw = await racing
    finally:
        await holder.close()
        await other.close()
    assert (status, raw, headers["Idempotent-Replayed"]) == (201, first, "true")
    assert await count(server, tasks) == 1  # the probe's; the raced request's rolled back


async def test_a_retry_whose_operation_now_refuses_replays_the_first_outcome(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """The second send of a key runs the operation again, which now refuses (the task is
    queued, not failed, and the name is taken): the stored outcome answers, not the refusal.
    An operation's refusal with no stored outcome under its key still answers as itself."""
    created = await post(http, server, body(server), "first-create")
    task_id = orjson.loads(created[2])["id"]
    async with http.post(
        f"{server.base_url}/api/v1/tasks/{task_id}/cancel", headers=server.auth
    ) as resp:
        assert resp.status == 200
    retry_url = f"{server.base_url}/api/v1/tasks/{task_id}/retry"
    answers = []
    for _ in range(2):
        headers = {**server.auth, "Idempotency-Key": "retry-once"}
        async with http.post(retry_url, headers=headers) as resp:
            answers.append((resp.status, resp.headers.copy(), await resp.read()))
    (first, _, raw), (again, replayed, raw_again) = answers
    assert (first, again, raw_again) == (201, 201, raw)
    assert replayed["Idempotent-Replayed"] == "true"
    headers = {**server.auth, "Idempotency-Key": "retry-twice"}
    async with http.post(retry_url, headers=headers) as resp:
        assert resp.status == 409 and "Idempotent-Replayed" not in resp.headers
    agent = {"name": "once", "title": "Once", "config": {"provider": "simulated", "model": "sim-1"}}
    made = []
    for _ in range(2):
        headers = {**server.auth, "Idempotency-Key": "agent-once"}
        async with http.post(f"{server.base_url}/api/v1/agents", json=agent, headers=headers) as r:
            made.append((r.status, r.headers.get("Idempotent-Replayed"), await r.read()))
    assert [(s, replay) for s, replay, _ in made] == [(201, None), (201, "true")]
    assert made[0][2] == made[1][2]


async def test_keys_are_scoped_to_the_caller(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """ID-4: the same key value from another key, or another workspace, is independent."""
    second = (await new_member(server, Role.MEMBER, "b@x")).key
    key = "shared-value"
    first = await post(http, server, body(server), key)
    other = await post(http, server, body(server), key, bearer(second))
    assert first[0] == other[0] == 201 and first[2] != other[2]
    assert "Idempotent-Replayed" not in other[1]
    assert await count(server, tasks) == 2
    # The same key on another route is another scope too (a comment on the created task).
    task_id = (await _json(first[2]))["id"]
    headers = {**server.auth, "Idempotency-Key": key}
    url = f"{server.base_url}/api/v1/tasks/{task_id}/comments"
    async with http.post(url, json={"body": "first"}, headers=headers) as resp:
        assert resp.status == 201 and "Idempotent-Replayed" not in resp.headers


async def _json(raw: bytes) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads(raw)
    return data


@pytest.mark.parametrize("bad", ["", "x" * 256, "clé"])
async def test_malformed_keys_are_400(
    server: RunningServer, http: aiohttp.ClientSession, bad: str
) -> None:
    """ID-5: empty, over-long, non-ASCII and control characters are refused before any work."""
    headers = {**server.auth, "Idempotency-Key": bad}
    url = f"{server.base_url}/api/v1/tasks"
    async with http.post(url, json=body(server), headers=headers) as resp:
        problem = await problem_of(resp, 400)
    assert problem["type"].endswith("/bad-request")
    assert problem["errors"][0]["field"] == "Idempotency-Key"
    assert await count(server, tasks) == 0


async def test_control_characters_in_a_key_are_400(server: RunningServer) -> None:
    """Sent over a raw socket: HTTP clients refuse to send such header values themselves."""
    payload = orjson.dumps(body(server))
    host, port = server.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: {server.auth['Authorization']}\r\n".encode()
        + b"Idempotency-Key: del\x7fete\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.1 400 "), response[:200]
    assert await count(server, tasks) == 0


async def test_a_key_may_be_255_printable_characters(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    key = "k" * 254 + "~"
    assert (await post(http, server, body(server), key))[0] == 201
    assert (await post(http, server, body(server), key))[1]["Idempotent-Replayed"] == "true"


async def test_an_expired_key_creates_anew(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """ID-5: after the TTL the stored outcome is gone and the key creates a new task."""
    key = "expiring"
    first = await post(http, server, body(server), key)
    async with server.services.store.write() as conn:
        row = (await conn.execute(sa.select(idempotency_keys))).one()
        ttl = row.expires_at - row.created_at
        assert ttl == timedelta(hours=24)
        await conn.execute(
            idempotency_keys.update().values(expires_at=server.services.clock() - timedelta(1))
        )
    second = await post(http, server, body(server), key)
    assert second[0] == 201 and "Idempotent-Replayed" not in second[1]
    assert second[2] != first[2]
    assert await count(server, tasks) == 2
    third = await post(http, server, body(server), key)
    assert third[1]["Idempotent-Replayed"] == "true" and third[2] == second[2]


async def test_client_errors_of_the_operation_are_stored_but_not_auth_or_conflicts(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """A 404 from the operation replays as the same 404; a 401 or 409 leaves the key usable."""
    missing = {"prompt": PROMPT, "agent_id": str(uuid.uuid4())}
    first = await post(http, server, missing, "lost-agent")
    again = await post(http, server, missing, "lost-agent")
    assert first[0] == again[0] == 404 and first[2] == again[2]
    assert again[1]["Idempotent-Replayed"] == "true"
    # 401: nothing is stored (no caller, no scope); the key then works normally.
    unauthorised = await post(http, server, body(server), "k401", {"Authorization": "Bearer x"})
    assert unauthorised[0] == 401
    assert (await post(http, server, body(server), "k401"))[0] == 201
    async with server.services.store.read() as conn:
        stored = {row.key for row in await conn.execute(sa.select(idempotency_keys.c.key))}
    assert stored == {"lost-agent", "k401"}


async def test_without_a_key_every_post_creates(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for _ in range(3):
        assert (await post(http, server, body(server), None))[0] == 201
    assert await count(server, tasks) == 3
    assert await count(server, idempotency_keys) == 0


async def test_validation_errors_do_not_consume_the_key(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert (await post(http, server, {"prompt": "short"}, "k"))[0] == 422
    assert (await post(http, server, body(server), "k"))[0] == 201
