"""The task API over a real socket, on both backends: contract, bad input, streaming."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import orjson
import pytest
import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from bullpen.store.tables import audit_events, run_events, tasks
from tests.support.db import count
from tests.support.http import bearer, problem_of
from tests.support.seed import other_workspace
from tests.support.servers import RunningServer
from tests.support.sse import read_events, text_of
from tests.support.tasks import PROMPT, expected_text


async def create(
    http: aiohttp.ClientSession,
    server: RunningServer,
    body: Any,
    headers: dict[str, str] | None = None,
) -> aiohttp.ClientResponse:
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        json=body,
        headers=server.auth if headers is None else headers,
    ) as resp:
        await resp.read()
        return resp


async def test_create_stream_and_read_back(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    resp = await create(http, server, {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)})
    assert resp.status == 201
    task = await resp.json()
    assert resp.headers["Location"] == f"/api/v1/tasks/{task['id']}"
    assert task["number"] == "BP-1" and task["status"] == "queued"
    assert task["prompt"] == PROMPT and task["run"]["status"] == "queued"

    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
    )
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].event == "status" and events[-1].event == "end"
    assert events[-1].data == {"status": "done"}
    assert text_of(events) == expected_text(server, PROMPT)

    async with http.get(f"{server.base_url}/api/v1/tasks/{task['id']}", headers=server.auth) as got:
        final = await got.json()
    assert final["status"] == "done" and final["result"] == text_of(events)
    run = final["run"]
    assert run["status"] == "done" and run["provider"] == "simulated" and run["model"] == "sim-1"
    assert run["ttft_ms"] > 0 and run["output_tokens"] == server.settings.sim_response_tokens
    assert run["first_token_at"] and run["finished_at"]
    assert await count(server, audit_events) == 2  # bootstrap + task.create


async def test_resume_after_last_event_id(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    resp = await create(http, server, {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)})
    url = f"{server.base_url}/api/v1/tasks/{(await resp.json())['id']}/events"
    first = await read_events(http, url, server.auth, stop_after=3)
    rest = await read_events(http, url, {**server.auth, "Last-Event-ID": str(first[-1].id)})
    whole = await read_events(http, url, server.auth)
    # A bare seq (this stream's ids before runs were numbered) means run 1.
    bare = await read_events(http, url, {**server.auth, "Last-Event-ID": str(first[-1].seq)})
    assert [e.id for e in bare] == [e.id for e in rest]
    assert [e.id for e in first + rest] == [e.id for e in whole]
    assert text_of(first + rest) == text_of(whole) == expected_text(server, PROMPT)
    async with server.services.store.read() as conn:
        stored = (
            await conn.execute(sa.select(sa.func.count()).select_from(run_events))
        ).scalar_one()
    assert stored == len(whole)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x" * 9, "agent_id": "AGENT"}, "prompt"),
        ({"prompt": "x" * 2001, "agent_id": "AGENT"}, "prompt"),
        ({"prompt": 12345678901, "agent_id": "AGENT"}, "prompt"),
        ({"prompt": ["x" * 20], "agent_id": "AGENT"}, "prompt"),
        ({"prompt": PROMPT, "agent_id": "not-a-uuid"}, "agent_id"),
        ({"prompt": PROMPT, "agent_id": 7}, "agent_id"),
        ({"agent_id": "AGENT"}, "prompt"),
        ({"prompt": PROMPT}, "agent_id"),
        ({"prompt": PROMPT, "agent_id": "AGENT", "status": "done"}, "status"),
    ],
)
async def test_bad_fields_get_422_with_details(
    server: RunningServer, http: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    body = {k: (str(server.boot.agent_id) if v == "AGENT" else v) for k, v in body.items()}
    problem = await problem_of(await create(http, server, body), 422)
    assert any(e["field"] == field for e in problem["errors"]), problem
    assert await count(server, tasks) == 0


async def test_boundary_prompt_lengths_are_accepted(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for size in (10, 2000):
        resp = await create(
            http, server, {"prompt": "y" * size, "agent_id": str(server.boot.agent_id)}
        )
        assert resp.status == 201
    assert await count(server, tasks) == 2


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b"null", b'"text"'])
async def test_malformed_json_bodies_get_422(
    server: RunningServer, http: aiohttp.ClientSession, raw: bytes
) -> None:
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        data=raw,
        headers={**server.auth, "Content-Type": "application/json"},
    ) as resp:
        await problem_of(resp, 422)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer bp_wrongwrongwrongwrongwrongwrong"},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
    ],
)
async def test_missing_or_wrong_key_gets_401(
    server: RunningServer, http: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    body = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
    resp = await create(http, server, body, headers=headers)
    await problem_of(resp, 401)
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    async with http.get(f"{server.base_url}/api/v1/tasks", headers=headers) as listing:
        await problem_of(listing, 401)
    assert await count(server, tasks) == 0


async def _other_workspace(server: RunningServer) -> tuple[Any, Any, str]:
    """A second workspace with an agent and a member's key."""
    svc = server.services
    now = svc.clock()
    async with svc.store.write() as conn:
        ws, _, key = await other_workspace(conn, secret=svc.secret, now=now, role=Role.MEMBER)
        agent = await agent_store.create_agent(
            conn, workspace_id=ws, name="theirs", title="", adapter="llm", config={}, now=now
        )
    return ws, agent, key


async def test_other_workspaces_objects_are_404(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    _, their_agent, their_key = await _other_workspace(server)
    problem = await problem_of(
        await create(http, server, {"prompt": PROMPT, "agent_id": str(their_agent)}), 404
    )
    assert "agent" in problem["detail"]
    resp = await create(http, server, {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)})
    mine = (await resp.json())["id"]
    theirs = bearer(their_key)
    for path in (f"/api/v1/tasks/{mine}", f"/api/v1/tasks/{mine}/events"):
        async with http.get(server.base_url + path, headers=theirs) as got:
            body = await problem_of(got, 404)
            assert mine not in str(body) or body["instance"].endswith(path)
    async with http.get(f"{server.base_url}/api/v1/tasks", headers=theirs) as listing:
        assert (await listing.json())["items"] == []


async def test_limits_methods_and_content_types(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    limit = server.settings.max_body_bytes
    big = b'{"prompt": "' + b"x" * limit + b'"}'
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        data=big,
        headers={**server.auth, "Content-Type": "application/json"},
    ) as resp:
        await problem_of(resp, 413)

    async def chunks() -> Any:
        yield b'{"prompt": "'
        for _ in range(limit // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        data=chunks(),
        headers={**server.auth, "Content-Type": "application/json"},
    ) as resp:
        await problem_of(resp, 413)
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        data="prompt=hello",
        headers={**server.auth, "Content-Type": "text/plain"},
    ) as resp:
        await problem_of(resp, 415)
    async with http.delete(f"{server.base_url}/api/v1/tasks", headers=server.auth) as resp:
        await problem_of(resp, 405)
        assert set(resp.headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "POST"}
    async with http.request("TRACE", f"{server.base_url}/api/v1/tasks") as resp:
        await problem_of(resp, 405)
    async with http.get(f"{server.base_url}/api/v1/nope", headers=server.auth) as resp:
        await problem_of(resp, 404)
    assert await count(server, tasks) == 0


async def test_list_paginates_with_a_cursor(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    created = []
    for i in range(5):
        resp = await create(
            http, server, {"prompt": f"{PROMPT} #{i}", "agent_id": str(server.boot.agent_id)}
        )
        created.append((await resp.json())["id"])
    seen: list[str] = []
    url = f"{server.base_url}/api/v1/tasks?limit=2"
    while url:
        async with http.get(url, headers=server.auth) as resp:
            page = await resp.json()
        assert len(page["items"]) <= 2
        seen.extend(item["id"] for item in page["items"])
        cursor = page["next_cursor"]
        url = f"{server.base_url}/api/v1/tasks?limit=2&cursor={cursor}" if cursor else ""
    assert seen == list(reversed(created))
    for bad in ("limit=0", "limit=101", "cursor=%%%", "cursor=Zm9v", "status=bogus"):
        async with http.get(f"{server.base_url}/api/v1/tasks?{bad}", headers=server.auth) as r:
            await problem_of(r, 422)


async def test_bad_last_event_id_and_unknown_task(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    resp = await create(http, server, {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)})
    url = f"{server.base_url}/api/v1/tasks/{(await resp.json())['id']}/events"
    for bad in ("-1", "abc", "1.5.2", "x.1", "1.99999999999", "1234567.1"):
        async with http.get(url, headers={**server.auth, "Last-Event-ID": bad}) as r:
            await problem_of(r, 422)
    unknown = "00000000-0000-4000-8000-000000000000"
    for path in (
        f"/api/v1/tasks/{unknown}",
        f"/api/v1/tasks/{unknown}/events",
        "/api/v1/tasks/not-a-uuid",
    ):
        async with http.get(server.base_url + path, headers=server.auth) as r:
            await problem_of(r, 404 if "not-a-uuid" not in path else 422)


async def test_provider_failure_ends_the_task_failed(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    async with svc.store.write() as conn:
        broken = await agent_store.create_agent(
            conn,
            workspace_id=server.boot.workspace_id,
            name="broken",
            title="",
            adapter="llm",
            config={"provider": "nowhere", "model": "m"},
            now=svc.clock(),
        )
    resp = await create(http, server, {"prompt": PROMPT, "agent_id": str(broken)})
    task_id = (await resp.json())["id"]
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task_id}/events", server.auth
    )
    assert [e.event for e in events] == ["status", "error", "end"]
    assert events[-1].data == {"status": "failed"}
    assert "not configured" in events[1].data["message"]
    async with http.get(f"{server.base_url}/api/v1/tasks/{task_id}", headers=server.auth) as r:
        body = await r.json()
    assert body["status"] == "failed" and "nowhere" in body["error"]


async def test_healthz_metrics_and_openapi(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{server.base_url}/healthz") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
    async with http.get(f"{server.base_url}/metrics", headers=server.auth) as resp:
        text = await resp.text()
    assert "process_resident_memory_bytes" in text and "bullpen_sse_subscribers" in text
    assert ("bullpen_db_pool_in_use" in text) == (not server.services.store.is_sqlite)
    async with http.get(f"{server.base_url}/openapi.json") as resp:
        spec = await resp.json()
    post = spec["paths"]["/api/v1/tasks"]["post"]
    assert {"201", "401", "404", "413", "415", "422"} <= set(post["responses"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]


async def test_concurrent_clients_each_get_their_own_complete_stream(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async def one(i: int) -> tuple[str, str]:
        prompt = f"{PROMPT} (client {i})"
        resp = await create(http, server, {"prompt": prompt, "agent_id": str(server.boot.agent_id)})
        task_id = (await resp.json())["id"]
        events = await read_events(
            http, f"{server.base_url}/api/v1/tasks/{task_id}/events", server.auth
        )
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].data == {"status": "done"}
        assert text_of(events) == expected_text(server, prompt)
        return task_id, text_of(events)

    results = await asyncio.gather(*(one(i) for i in range(20)))
    async with server.services.store.read() as conn:
        stored = dict((await conn.execute(sa.select(tasks.c.id, tasks.c.result))).all())
    assert {str(k): v for k, v in stored.items()} == dict(results)


@pytest.mark.with_settings(max_body_bytes=4096)
async def test_the_direct_create_answers_as_the_middleware_stack_would(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """`POST /api/v1/tasks` is served ahead of the middleware stack (`BullpenApp.direct`),
    its parameters resolved by its own handler. Every request below gets the same answer
    from it as from the stack, where FastAPI resolves them: status, problem type and fields,
    headers, the created task's shape; and the same order of refusals when several apply."""
    async with http.post(
        server.base_url + "/api/v1/api-keys",
        json={"name": "ro", "scopes": ["tasks:read"]},
        headers=server.auth,
    ) as resp:
        read_only = bearer((await resp.json())["key"])
    url = server.base_url + "/api/v1/tasks"
    task = {"agent_id": str(server.boot.agent_id), "prompt": PROMPT}
    as_json = {**server.auth, "Content-Type": "application/json"}

    def dumps(value: Any) -> bytes:
        return orjson.dumps(value)

    def cases(run: str) -> list[tuple[str, dict[str, str], bytes]]:
        key = {"Idempotency-Key": f"{run}-key"}
        return [
            ("created", as_json, dumps(task)),
            ("keyed", {**as_json, **key}, dumps(task)),
            ("replayed", {**as_json, **key}, dumps(task)),
            ("key reused", {**as_json, **key}, dumps({**task, "prompt": "other"})),
            ("key too long", {**as_json, "Idempotency-Key": "k" * 256}, dumps(task)),
            ("not json", {**server.auth, "Content-Type": "text/plain"}, dumps(task)),
            ("anonymous", {"Content-Type": "application/json"}, dumps(task)),
            ("read only", {**read_only, "Content-Type": "application/json"}, dumps(task)),
            ("bad json", as_json, b'{"prompt": '),
            ("no prompt", as_json, dumps({"agent_id": task["agent_id"]})),
            ("unknown field", as_json, dumps({**task, "colour": "red"})),
            ("no agent", as_json, dumps({**task, "agent_id": str(uuid.uuid4())})),
            ("too big", as_json, dumps({**task, "prompt": "x" * 5000})),
            ("not json, anonymous", {"Content-Type": "text/plain"}, dumps(task)),
            ("bad key and body", {**as_json, "Idempotency-Key": "k" * 256}, b"{"),
        ]

    async def answers(run: str) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}
        for name, headers, data in cases(run):
            async with http.post(url, data=data, headers=headers) as resp:
                body = orjson.loads(await resp.read())
                kept = {h: resp.headers.get(h) for h in ("Content-Type", "WWW-Authenticate")}
                kept |= {h: h in resp.headers for h in ("Location", "Content-Security-Policy")}
                kept["replayed"] = resp.headers.get("Idempotent-Replayed")
                if resp.status == 201:
                    shape: Any = sorted(body)
                else:
                    shape = (body["type"], body.get("detail"), body.get("errors"))
                out[name] = (resp.status, kept, shape)
        return out

    direct = await answers("direct")
    assert [v[0] for v in direct.values()] == [
        201,
        201,
        201,
        422,
        400,
        415,
        401,
        403,
        422,
        422,
        422,
        404,
        413,
        415,
        400,
    ]
    saved, server.app.direct = server.app.direct, {}
    try:
        stacked = await answers("stack")
    finally:
        server.app.direct = saved
    assert direct == stacked
