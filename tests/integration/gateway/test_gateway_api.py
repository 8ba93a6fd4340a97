"""Providers and model routes through the API, and the OpenAI-compatible relay used by the
official `openai` SDK, against the built-in simulator over real sockets (both backends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import aiohttp
import openai
import orjson
import pytest
import sqlalchemy as sa

from bullpen.simulator.provider import SimConfig, SimulatedProvider, completion_tokens
from bullpen.store.tables import audit_events, cost_events, providers
from tests.support.db import count, rows
from tests.support.http import PROBLEM, bearer, call, problem, problem_of
from tests.support.seed import other_workspace
from tests.support.servers import RunningServer

KEY = "sk-test-PROVIDERKEY-0123456789"
MESSAGES = [{"role": "user", "content": "Say something short please"}]
# The built-in simulator answers FAST_SIM's 24 tokens; its prompt count is words + 3 a message.
ANSWER = "".join(completion_tokens(MESSAGES, 24))
PROMPT_TOKENS = 4 + 3


def provider_body(server: RunningServer, **fields: Any) -> dict[str, Any]:
    assert server.services.simulator is not None
    return {
        "name": "priced",
        "base_url": server.services.simulator.base_url,
        "api_key": KEY,
        "models": [
            {"name": "sim-1", "input_per_mtok": 2.0, "output_per_mtok": 10.0},
            {"name": "other", "input_per_mtok": 1.0, "output_per_mtok": 1.0},
        ],
        "timeouts": {"ttft_s": 5},
        **fields,
    }


async def test_providers_keep_their_key_secret(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    created = await call(http, server, "POST", "/api/v1/providers", body=provider_body(server))
    assert created.status == 201, created.text
    provider = created.body
    assert provider["api_key_hint"] == "sk-…6789"
    assert provider["timeouts"]["ttft_s"] == 5
    assert provider["timeouts"]["connect_s"] == server.settings.provider_connect_timeout_s
    assert provider["models"][0] == {
        "name": "sim-1",
        "input_per_mtok": 2.0,
        "cached_input_per_mtok": 2.0,
        "output_per_mtok": 10.0,
    }
    assert KEY not in created.text
    listed = await call(http, server, "GET", "/api/v1/providers")
    assert [p["name"] for p in listed.body["items"]] == ["priced"] and KEY not in listed.text
    # At rest the key is ciphertext only; the audit log records that a key was set.
    [row] = await rows(server, sa.select(providers))
    assert row.api_key_ciphertext and KEY.encode() not in row.api_key_ciphertext
    created_audit = await rows(
        server, sa.select(audit_events).where(audit_events.c.action == "provider.create")
    )
    assert created_audit[0].data["api_key_set"] is True
    assert KEY not in str(created_audit[0].data)

    path = f"/api/v1/providers/{provider['id']}"
    changed = await call(http, server, "PATCH", path, body={"api_key": "sk-other-key-abcdefgh"})
    assert changed.body["api_key_hint"] == "sk-…efgh"
    removed = await call(http, server, "PATCH", path, body={"api_key": None})
    assert removed.body["api_key_hint"] is None
    timeouts = await call(http, server, "PATCH", path, body={"timeouts": {"idle_s": 7}})
    assert timeouts.body["timeouts"]["idle_s"] == 7 and timeouts.body["timeouts"]["ttft_s"] == 5
    updates = await rows(
        server, sa.select(audit_events).where(audit_events.c.action == "provider.update")
    )
    assert len(updates) == 3 and "sk-other" not in str([u.data for u in updates])

    again = await call(http, server, "POST", "/api/v1/providers", body=provider_body(server))
    assert problem(again, 409)["type"].endswith("/conflict")
    builtin = await call(
        http, server, "POST", "/api/v1/providers", body=provider_body(server, name="simulated")
    )
    assert "built-in" in problem(builtin, 409)["detail"]
    for bad in (
        {"base_url": "http://user:pass@example.com/v1"},
        {"base_url": "ftp://example.com"},
        {"base_url": "http://example.com/v1?key=1"},
        {"name": "has/slash"},
        {"models": [{"name": "m"}, {"name": "m"}]},
        {"models": [{"name": "m", "input_per_mtok": -1}]},
        {"timeouts": {"ttft_s": 0}},
        {"api_key": "has a space"},
        {"surprise": 1},
    ):
        reply = await call(
            http,
            server,
            "POST",
            "/api/v1/providers",
            body={**provider_body(server, name="x"), **bad},
        )
        problem(reply, 422)
        assert "has a space" not in reply.text
    assert await count(server, providers) == 1
    deleted = await call(http, server, "DELETE", path)
    assert deleted.status == 204
    assert (await call(http, server, "GET", path)).status == 404


async def test_routes_check_their_chain_and_protect_their_providers(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    provider = (
        await call(http, server, "POST", "/api/v1/providers", body=provider_body(server))
    ).body
    chain = [{"provider": "priced", "model": "sim-1"}, {"provider": "simulated", "model": "sim-1"}]
    made = await call(
        http, server, "POST", "/api/v1/model-routes", body={"name": "smart", "chain": chain}
    )
    assert made.status == 201, made.text
    assert made.body["chain"] == chain
    for bad_chain, why, status in (
        ([{"provider": "nobody", "model": "m"}], "no provider named", 404),
        ([{"provider": "priced", "model": "unlisted"}], "offers no model", 404),
    ):
        reply = await call(
            http, server, "POST", "/api/v1/model-routes", body={"name": "r", "chain": bad_chain}
        )
        assert why in problem(reply, status)["detail"]
    problem(await call(http, server, "POST", "/api/v1/model-routes", body={"name": "r"}), 422)
    too_long = [{"provider": "simulated", "model": f"m{i}"} for i in range(9)]
    problem(
        await call(
            http, server, "POST", "/api/v1/model-routes", body={"name": "r", "chain": too_long}
        ),
        422,
    )
    provider_path = f"/api/v1/providers/{provider['id']}"
    in_use = await call(http, server, "DELETE", provider_path)
    assert "smart" in problem(in_use, 409)["detail"]
    renamed = await call(http, server, "PATCH", provider_path, body={"name": "renamed"})
    problem(renamed, 409)
    route_path = f"/api/v1/model-routes/{made.body['id']}"
    shorter = await call(http, server, "PATCH", route_path, body={"chain": chain[1:]})
    assert shorter.body["chain"] == chain[1:]
    assert (await call(http, server, "DELETE", provider_path)).status == 204
    assert (await call(http, server, "DELETE", route_path)).status == 204
    assert (await call(http, server, "GET", "/api/v1/model-routes")).body["items"] == []


async def test_the_openai_sdk_streams_and_non_streams_through_the_relay(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await call(http, server, "POST", "/api/v1/providers", body=provider_body(server))
    route = {"name": "smart", "chain": [{"provider": "priced", "model": "sim-1"}]}
    await call(http, server, "POST", "/api/v1/model-routes", body=route)
    client = openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key=server.boot.api_key, max_retries=0
    )
    async with client:
        models = [m.id async for m in client.models.list()]
        assert models == ["smart", "priced/other", "priced/sim-1", "simulated/sim-1"]

        stream = await client.chat.completions.create(
            model="smart",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage, roles = [], None, None, []
        async for chunk in stream:
            assert chunk.model == "smart" and chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.delta.role)
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                finish = choice.finish_reason or finish
        assert "".join(pieces) == ANSWER and len(pieces) > 1
        assert roles == ["assistant"] and finish == "stop"
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS, 24)

        whole = await client.chat.completions.with_raw_response.create(
            model="priced/sim-1",
            messages=MESSAGES,
            max_tokens=5,  # type: ignore[arg-type]
        )
        assert whole.headers["x-bullpen-provider"] == "priced"
        completion = whole.parse()
        assert completion.choices[0].message.content == "".join(completion_tokens(MESSAGES, 5))
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == 5

        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="nope", messages=MESSAGES)  # type: ignore[arg-type]
        assert "nope" in missing.value.message
        with pytest.raises(openai.UnprocessableEntityError):
            await client.chat.completions.create(model="smart", messages=MESSAGES, n=2)  # type: ignore[arg-type]

    # The usage of both calls, priced, against the caller's key.
    for _ in range(100):
        if await count(server, cost_events) == 2:
            break
        await asyncio.sleep(0.02)
    ledger = await rows(server, sa.select(cost_events).order_by(cost_events.c.output_tokens))
    assert [(r.provider, r.model, r.output_tokens) for r in ledger] == [
        ("priced", "sim-1", 5),
        ("priced", "sim-1", 24),
    ]
    assert all(r.api_key_id is not None and r.run_id is None for r in ledger)
    assert ledger[1].cost_usd == pytest.approx((PROMPT_TOKENS * 2.0 + 24 * 10.0) / 1e6)


async def test_relay_problems_are_also_openai_errors(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {"model": "simulated/sim-1", "messages": MESSAGES}
    anonymous = await call(http, server, "POST", "/v1/chat/completions", headers={}, body=body)
    details = problem(anonymous, 401)
    assert details["error"]["message"] == details["detail"]
    for bad in (
        {"model": "simulated/sim-1"},
        {"model": "simulated/sim-1", "messages": []},
        {"model": "simulated/sim-1", "messages": [{"role": "robot", "content": "x"}]},
        {**body, "stream": "yes"},
        {**body, "max_tokens": 0},
        {**body, "stream_options": {"include_usage": True, "other": 1}},
    ):
        problem(await call(http, server, "POST", "/v1/chat/completions", body=bad), 422)
    missing = await call(http, server, "POST", "/v1/chat/completions", body={**body, "model": "x"})
    assert problem(missing, 404)["type"].endswith("/model-not-found")


SECURITY = ("X-Content-Type-Options", "X-Frame-Options", "Content-Security-Policy")


@pytest.mark.with_settings(relay_max_body_bytes=2048)
async def test_the_relays_direct_path_answers_as_the_middleware_stack_would(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # The relay's chat completions are served ahead of the middleware stack; what the stack
    # gives every other route, this path gives itself.
    url = server.base_url + "/v1/chat/completions"
    body = {"model": "simulated/sim-1", "messages": MESSAGES, "stream": True}
    async with http.post(url, json=body, headers=server.auth) as resp:
        assert resp.status == 200 and b"data: [DONE]" in await resp.read()
        assert all(name in resp.headers for name in SECURITY)

    big = {**body, "messages": [{"role": "user", "content": "x" * 4096}]}
    too_big = await call(http, server, "POST", "/v1/chat/completions", body=big)
    assert problem(too_big, 413)["detail"].endswith("limit of 2048 bytes.")
    assert all(name in too_big.headers for name in SECURITY)

    async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: caught while read
        yield b'{"model": "simulated/sim-1", "messages": [{"role": "user", "content": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}]}'

    headers = {**server.auth, "Content-Type": "application/json"}
    async with http.post(url, data=streamed(), headers=headers) as resp:
        assert resp.status == 413
        assert (await resp.json())["type"].endswith("/payload-too-large")

    plain = {**server.auth, "Content-Type": "text/plain"}
    async with http.post(url, data=orjson.dumps(body), headers=plain) as resp:
        assert resp.status == 415 and resp.headers["Content-Type"] == PROBLEM
    async with http.post(url, data=b'{"model": ', headers=headers) as resp:
        invalid = await resp.json()
        assert resp.status == 422 and invalid["errors"][0]["location"] == "body"
    wrong = await call(http, server, "POST", "/v1/chat/completions", body={**body, "n": 2})
    assert problem(wrong, 422)["errors"][0]["field"] == "n"
    anonymous = await call(http, server, "POST", "/v1/chat/completions", headers={}, body=body)
    assert problem(anonymous, 401)["error"]["type"] == "unauthenticated"
    assert anonymous.headers["WWW-Authenticate"] == "Bearer"

    # Other methods go through the stack, to the same route.
    async with http.get(url, headers=server.auth) as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
        assert all(name in resp.headers for name in SECURITY)


async def open_stream(
    http: aiohttp.ClientSession, server: RunningServer, key: str, stack: AsyncExitStack
) -> aiohttp.ClientResponse:
    """A relay stream of the built-in simulator, held open (its answer is slow) until `stack`
    closes; its status is known once the first words have arrived, or it was refused."""
    body = {"model": "simulated/sim-1", "messages": MESSAGES, "stream": True}
    return await stack.enter_async_context(
        http.post(server.base_url + "/v1/chat/completions", json=body, headers=bearer(key))
    )


# Issue 19, finding 4: the stream cap was per process only, so one tenant's slow streams took
# every slot and the others got 503. Each workspace, and each key, now holds a share of it.
@pytest.mark.with_settings(
    sim_tokens_per_second=1.0,  # 24 tokens: each stream lasts 24 s unless its client leaves
    relay_max_streams=4,
    relay_max_streams_per_workspace=3,
    relay_max_streams_per_key=2,
)
async def test_one_tenant_cannot_take_every_relay_stream_slot(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    svc = server.services
    async with svc.store.write() as conn:
        _, _, their_key = await other_workspace(conn, secret=svc.secret, now=svc.clock())
    own_key = server.boot.api_key
    second = await call(http, server, "POST", "/api/v1/api-keys", body={"name": "second"})
    assert second.status == 201, second.text
    second_key = second.body["key"]

    async with AsyncExitStack() as stack:
        # Tenant A floods: its first key fills the key's share, its second the workspace's.
        flood = [
            await open_stream(http, server, key, stack)
            for key in (own_key, own_key, own_key, second_key, second_key)
        ]
        # Tenant B still gets through.
        assert (await open_stream(http, server, their_key, stack)).status == 200
        assert [resp.status for resp in flood] == [200, 200, 429, 200, 429]
        for refused, what in ((flood[2], "key"), (flood[4], "workspace")):
            details = await problem_of(refused, 429)
            assert what in details["detail"] and details["error"]["type"] == "rate-limited"
            assert refused.headers["Retry-After"] == "1"
        # Past the process's own cap it is 503, for anyone.
        full = await open_stream(http, server, their_key, stack)
        assert (await problem_of(full, 503))["error"]["type"] == "unavailable"
        assert svc.relay_slots.held == 4
    # Every stream's client has left: its slot, and its share, are free again.
    for _ in range(500):
        if svc.relay_slots.held == 0:
            break
        await asyncio.sleep(0.01)
    assert svc.relay_slots.held == 0
    async with AsyncExitStack() as stack:
        assert (await open_stream(http, server, own_key, stack)).status == 200


WIDE = "模型-1"  # printable, outside Latin-1
# Names no model has: control characters (C0, DEL, C1), line and paragraph separators, format
# characters (zero width, bidi override), and one character too many.
UNPRINTABLE = (
    "sim-1\r\nX-Injected: yes",
    "sim-1\n",
    "sim-1\x00",
    "sim-1\x7f",
    "sim-1\x85",
    "sim-1\u2028",
    "sim\u200b-1",
    "sim-1\u202e",
    "m" * 301,
)


# Issue 19, finding 8d: the model name was reflected into `X-Bullpen-Model`; outside Latin-1
# it was a 500, with CR/LF a dropped connection, each after the provider's answer was billed.
async def test_model_names_are_checked_first_and_the_model_header_stays_safe(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    # A provider listing no models takes any name the caller gives, and its simulator
    # answers to every name below, so nothing but the relay's own check stands in between.
    config = SimConfig(
        ttft_ms=5, tokens_per_second=2000, response_tokens=4, models=(WIDE, *UNPRINTABLE)
    )
    async with SimulatedProvider(config) as sim:
        body = {"name": "open", "base_url": sim.base_url, "models": []}
        assert (await call(http, server, "POST", "/api/v1/providers", body=body)).status == 201
        # Refused before any provider call, streamed or not: nothing to bill.
        for name in UNPRINTABLE:
            for stream in (False, True):
                request = {"model": f"open/{name}", "messages": MESSAGES, "stream": stream}
                reply = await call(http, server, "POST", "/v1/chat/completions", body=request)
                details = problem(reply, 422)
                assert details["errors"][0]["field"] == "model", details
                assert details["error"]["type"] == "validation"
        assert sim.total_requests == 0

        # A printable name outside Latin-1 is served; the header names the catalog's model,
        # percent-encoded (UTF-8).
        for stream in (False, True):
            request = {"model": f"open/{WIDE}", "messages": MESSAGES, "stream": stream}
            async with http.post(
                server.base_url + "/v1/chat/completions", json=request, headers=server.auth
            ) as resp:
                text = await resp.text()
                assert resp.status == 200, text
                assert resp.headers["X-Bullpen-Model"] == quote(WIDE)
                assert resp.headers["X-Bullpen-Provider"] == "open"
        assert sim.total_requests == 2
    # Only the two served calls are in the ledger.
    for _ in range(200):
        if await count(server, cost_events) == 2:
            break
        await asyncio.sleep(0.02)
    ledger = await rows(server, sa.select(cost_events))
    assert [(r.provider, r.model) for r in ledger] == [("open", WIDE)] * 2


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.with_settings(worker_enabled=False)
async def test_a_catalog_load_cancelled_with_its_caller_still_serves_the_others(
    server: RunningServer,
) -> None:
    """Callers share one load of a workspace's catalog. When the one loading it is cancelled
    (its run stopped, its client gone), the others load it again: they are not ended as if
    they had been cancelled too."""
    directory = server.services.directory
    workspace_id = server.boot.workspace_id
    directory.invalidate(workspace_id)
    async with server.services.store.engine.begin() as conn:  # type: ignore[union-attr]
        # The load's read of the providers waits behind this lock until the block ends.
        await conn.execute(sa.text("LOCK TABLE providers IN ACCESS EXCLUSIVE MODE"))
        loader = asyncio.create_task(directory.catalog(workspace_id))
        await asyncio.sleep(0.2)
        waiter = asyncio.create_task(directory.catalog(workspace_id))
        await asyncio.sleep(0.1)
        loader.cancel()
        await asyncio.sleep(0.1)
        assert not waiter.done()
    catalog = await asyncio.wait_for(waiter, 5)
    assert "simulated" in catalog.providers
    assert loader.cancelled()
