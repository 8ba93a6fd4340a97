"""The gateway inside Bullpen: runs of an agent on a route with faults, the relay's error
paths, and the canary sweep (a provider key that must appear nowhere). Both backends; the
providers are simulators on real sockets, the first one requiring the key."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import sqlalchemy as sa

from bullpen.agents.llm import DEFAULT_SYSTEM_PROMPT
from bullpen.simulator.provider import SimConfig, SimulatedProvider, completion_tokens
from bullpen.store.tables import cost_events, metadata, users
from tests.support.canary import encodings
from tests.support.db import count, rows
from tests.support.http import call, problem
from tests.support.seed import open_session
from tests.support.servers import RunningServer
from tests.support.sse import read_events, text_of
from tests.support.tasks import PROMPT, new_task, wait_status

CANARY = "sk-canary-" + secrets.token_hex(16)
TOKENS = 8
MESSAGES = [
    {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
    {"role": "user", "content": PROMPT},
]
FULL = completion_tokens(MESSAGES, TOKENS)


@pytest.fixture
async def sims() -> AsyncIterator[list[SimulatedProvider]]:
    """The primary (which insists on the canary key) and a backup."""
    configs = [
        SimConfig(
            ttft_ms=5, tokens_per_second=2000, response_tokens=TOKENS, models=("m",), api_key=CANARY
        ),
        SimConfig(ttft_ms=5, tokens_per_second=2000, response_tokens=TOKENS, models=("m",)),
    ]
    started = [SimulatedProvider(c) for c in configs]
    for sim in started:
        await sim.__aenter__()
    try:
        yield started
    finally:
        for sim in started:
            await sim.__aexit__(None, None, None)


async def configure(
    server: RunningServer, http: aiohttp.ClientSession, sims: list[SimulatedProvider]
) -> None:
    """Providers `primary` (the canary key) and `backup`, route `smart`, the agent on it."""
    for name, sim, key in (("primary", sims[0], CANARY), ("backup", sims[1], None)):
        body: dict[str, Any] = {
            "name": name,
            "base_url": sim.base_url,
            "models": [{"name": "m", "input_per_mtok": 3.0, "output_per_mtok": 15.0}],
            "timeouts": {"ttft_s": 1, "idle_s": 1},
        }
        if key:
            body["api_key"] = key
        assert (await call(http, server, "POST", "/api/v1/providers", body=body)).status == 201
    chain = [{"provider": "primary", "model": "m"}, {"provider": "backup", "model": "m"}]
    route = {"name": "smart", "chain": chain}
    assert (await call(http, server, "POST", "/api/v1/model-routes", body=route)).status == 201
    agent = f"/api/v1/agents/{server.boot.agent_id}"
    patched = await call(http, server, "PATCH", agent, body={"config": {"model": "smart"}})
    assert patched.status == 200, patched.text


async def finished_run(
    http: aiohttp.ClientSession, server: RunningServer, status: str
) -> tuple[dict[str, Any], list[Any]]:
    """Create a task, wait for `status`; its run and its stream's events."""
    task = await new_task(http, server)
    done = await wait_status(http, server, task["id"], status)
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
    )
    return done["run"], events


async def test_runs_fall_back_fail_visibly_and_record_every_attempt(
    server: RunningServer, http: aiohttp.ClientSession, sims: list[SimulatedProvider]
) -> None:
    primary, backup = sims
    await configure(server, http, sims)

    primary.fault = "503"
    run, events = await finished_run(http, server, "done")
    assert (run["provider"], run["model"], run["error_code"]) == ("backup", "m", None)
    assert [(c["provider"], c["outcome"], c["reason"]) for c in run["llm_calls"]] == [
        ("primary", "failed", "http-503"),
        ("backup", "ok", None),
    ]
    assert text_of(events) == "".join(FULL)
    assert run["cost_usd"] == pytest.approx((run["input_tokens"] * 3 + TOKENS * 15) / 1e6)
    [ledger] = await rows(server, sa.select(cost_events))
    assert str(ledger.run_id) == run["id"] and ledger.provider == "backup"
    assert ledger.agent_id == server.boot.agent_id

    primary.fault = "error-after:3"
    calls_before = backup.total_requests
    run, events = await finished_run(http, server, "failed")
    assert run["error_code"] == "provider-incomplete" and "partial text is kept" in run["error"]
    assert (run["attempt"], run["failures"]) == (1, 0)  # never retried after content
    assert [(c["provider"], c["outcome"]) for c in run["llm_calls"]] == [("primary", "incomplete")]
    assert text_of(events) == "".join(FULL[:3])  # the partial text, kept, not duplicated
    [error] = [e for e in events if e.event == "error"]
    assert error.data["partial"] is True and error.data["code"] == "provider-incomplete"
    assert backup.total_requests == calls_before

    primary.fault = "spend-limit"
    run, events = await finished_run(http, server, "failed")
    assert run["error_code"] == "provider-spend-limit" and run["attempt"] == 1
    assert text_of(events) == "" and backup.total_requests == calls_before


async def test_a_relay_caller_hanging_up_mid_answer_closes_the_upstream_request(
    server: RunningServer, http: aiohttp.ClientSession, sims: list[SimulatedProvider]
) -> None:
    primary, _ = sims
    await configure(server, http, sims)
    primary.fault = "slow:20"  # 8 tokens over 400 ms
    body = {"model": "smart", "messages": MESSAGES, "stream": True}
    url = server.base_url + "/v1/chat/completions"
    async with http.post(url, json=body, headers=server.auth) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if b'"content":"' in line and b'"content":""' not in line:
                break
        assert primary.streaming == 1
        resp.close()  # gone after the first words
    for _ in range(300):
        settled = await count(server, cost_events) == 1
        if settled and primary.streaming == 0 and server.services.relay_slots.held == 0:
            break
        await asyncio.sleep(0.01)
    # The provider saw its client leave mid-answer (nobody reads on at its expense), the
    # stream slot is free again, and the words it did send are metered.
    assert (primary.abandoned, primary.streaming) == (1, 0)
    assert server.services.relay_slots.held == 0
    [ledger] = await rows(server, sa.select(cost_events))
    assert ledger.provider == "primary" and 1 <= ledger.output_tokens < TOKENS


async def test_relay_errors_keep_their_type_and_mid_stream_failures_raise_in_the_sdk(
    server: RunningServer, http: aiohttp.ClientSession, sims: list[SimulatedProvider]
) -> None:
    primary, backup = sims
    await configure(server, http, sims)
    body = {"model": "smart", "messages": MESSAGES}
    primary.fault = backup.fault = "503"
    down = await call(http, server, "POST", "/v1/chat/completions", body=body)
    assert problem(down, 503)["type"].endswith("/provider-unavailable")
    assert int(down.headers["Retry-After"]) >= 1
    primary.fault = "spend-limit"
    spent = await call(http, server, "POST", "/v1/chat/completions", body=body)
    assert problem(spent, 402)["error"]["code"] == "provider-spend-limit"

    primary.fault, backup.fault = "error-after:3", None
    client = openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key=server.boot.api_key, max_retries=0
    )
    async with client:
        stream = await client.chat.completions.create(
            model="smart",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
        )
        pieces: list[str] = []
        with pytest.raises(openai.APIError, match="partial text is kept"):
            async for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        pieces.append(choice.delta.content)
        assert pieces == FULL[:3]
        # Non-streamed, the same failure is a plain 502 (nothing was sent yet).
        with pytest.raises(openai.APIStatusError) as err:
            await client.chat.completions.create(model="smart", messages=MESSAGES)  # type: ignore[arg-type]
        assert err.value.status_code == 502


async def test_the_provider_key_appears_nowhere(
    server: RunningServer,
    http: aiohttp.ClientSession,
    sims: list[SimulatedProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    primary, _backup = sims
    seen: list[str] = []  # every response: status line, headers and body

    async def api(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        reply = await call(http, server, method, path, body=body, **kw)
        seen.append(f"{reply.status} {dict(reply.headers)} {reply.text}")
        return reply

    await configure(server, http, sims)
    listed = await api("GET", "/api/v1/providers")
    for provider in listed.body["items"]:
        await api("PATCH", f"/api/v1/providers/{provider['id']}", {"timeouts": {"idle_s": 2}})
        await api("GET", f"/api/v1/providers/{provider['id']}")
    await api(
        "POST",
        "/api/v1/providers",
        {"name": "dup", "base_url": "http://x.io", "api_key": CANARY + " "},
    )

    task_ids = []
    for fault in ("echo", "echo-error", "401", "503", "error-after:3", "hang", None):
        primary.fault = fault
        task = (
            await api(
                "POST", "/api/v1/tasks", {"prompt": PROMPT, "agent_id": str(server.boot.agent_id)}
            )
        ).body
        task_ids.append(task["id"])
        await wait_status(
            http,
            server,
            task["id"],
            "failed" if fault in ("echo-error", "401", "error-after:3") else "done",
        )
    primary.fault = "echo"
    for stream in (False, True):
        relay = {"model": "primary/m", "messages": MESSAGES, "stream": stream}
        async with http.post(
            server.base_url + "/v1/chat/completions", json=relay, headers=server.auth
        ) as resp:
            text = await resp.text()
            assert resp.status == 200 and "[redacted]" in text
            seen.append(f"{resp.status} {dict(resp.headers)} {text}")
    primary.fault = "echo-error"
    refused = await api(
        "POST", "/v1/chat/completions", {"model": "primary/m", "messages": MESSAGES}
    )
    assert refused.status == 502
    for task_id in task_ids:
        await api("GET", f"/api/v1/tasks/{task_id}")
        await api("GET", f"/api/v1/tasks/{task_id}/runs")
        events = await read_events(
            http, f"{server.base_url}/api/v1/tasks/{task_id}/events", server.auth
        )
        seen.append(repr([(e.event, e.data) for e in events]))
    for path in (
        "/api/v1/tasks",
        "/api/v1/audit-events",
        "/api/v1/model-routes",
        "/v1/models",
        "/api/v1/agents",
    ):
        await api("GET", path)
    async with http.get(server.base_url + "/metrics", headers=server.auth) as resp:
        metrics = await resp.text()
    [primary_id] = [p["id"] for p in listed.body["items"] if p["name"] == "primary"]
    assert f'bullpen_gateway_fallbacks_total{{provider="{primary_id}",reason="http-503"}}' in (
        metrics
    )
    assert 'provider="primary"' not in metrics  # a workspace's own names stay out of /metrics
    seen.append(metrics)
    # The pages a signed-in user sees.
    [admin] = await rows(server, sa.select(users.c.id))
    cookie = {"Cookie": f"bullpen_session={await open_session(server, admin.id)}"}
    for page in ["/", *(f"/tasks/{t}" for t in task_ids)]:
        async with http.get(server.base_url + page, headers=cookie) as resp:
            assert resp.status == 200
            seen.append(await resp.text())
    # Every row of every table (the sealed key is bytes under AES-GCM: the one allowlisted place).
    async with server.services.store.read() as conn:
        for table in metadata.sorted_tables:
            for row in await conn.execute(sa.select(table)):
                seen.append(repr(dict(row._mapping)))
    logged = [caplog.text] + [repr(r.__dict__) for r in caplog.records]

    assert primary.requests  # the key was really used: the primary refuses requests without it
    haystacks = {"responses, events, pages and rows": "\n".join(seen), "logs": "\n".join(logged)}
    for where, text in haystacks.items():
        for form in encodings(CANARY):
            assert form not in text, f"the provider key leaked into {where} as {form!r}"


def calls_tool(arguments: dict[str, str]) -> str:
    """A system prompt whose simulated model calls `finish` with these arguments (streamed in
    two pieces split at the middle, as the simulator does)."""
    turn = {"tool_calls": [{"name": "finish", "arguments": arguments}]}
    return f"Work.\n<sim-script>{json.dumps([turn])}</sim-script>"


# Issue 19, finding 11c: tool call arguments were masked chunk by chunk, so a provider key
# split across two chunks reached relay callers, run events and task results whole.
async def test_a_key_split_across_tool_call_chunks_is_masked_for_relay_callers_and_runs(
    server: RunningServer, http: aiohttp.ClientSession, sims: list[SimulatedProvider]
) -> None:
    await configure(server, http, sims)
    arguments = {"result": CANARY}
    whole = json.dumps(arguments, separators=(",", ":"))
    assert whole.index(CANARY) < len(whole) // 2 < whole.index(CANARY) + len(CANARY)
    system = calls_tool(arguments)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": PROMPT}]
    client = openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key=server.boot.api_key, max_retries=0
    )
    async with client:
        answer = await client.chat.completions.create(model="primary/m", messages=messages)  # type: ignore[arg-type]
        [called] = answer.choices[0].message.tool_calls or []
        assert json.loads(called.function.arguments) == {"result": "[redacted]"}
        stream = await client.chat.completions.create(
            model="primary/m",
            messages=messages,  # type: ignore[arg-type]
            stream=True,
        )
        pieces = [
            piece.function.arguments or ""
            async for chunk in stream
            for choice in chunk.choices
            for piece in choice.delta.tool_calls or ()
            if piece.function is not None
        ]
        assert json.loads("".join(pieces)) == {"result": "[redacted]"}
        assert len(pieces) >= 3  # the name's, and the arguments in pieces

    # An agent's run: its tool call event and the task's result.
    agent = f"/api/v1/agents/{server.boot.agent_id}"
    config = {"model": "smart", "system_prompt": system}
    assert (await call(http, server, "PATCH", agent, body={"config": config})).status == 200
    task = await new_task(http, server)
    done = await wait_status(http, server, task["id"], "done")
    assert done["result"] == "[redacted]"
    url = f"{server.base_url}/api/v1/tasks/{task['id']}/events"
    events = await read_events(http, url, server.auth)
    tool_events = [e.data for e in events if e.event == "tool_call"]
    assert tool_events and CANARY not in json.dumps([e.data for e in events])
