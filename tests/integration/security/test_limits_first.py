"""BI-2 (TEST-PLAN): every size limit answers 413/422 before any provider call.

The workspace's only provider is a simulator of this test's own, counting its requests; the
demo agent is moved onto it. Over-limit bodies, strings, arrays, page sizes and token counts,
on the relay and on task creation, are refused with problem+json, and the simulator has
seen no request at the end. A within-limit call then reaches it, so the count can move.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bullpen.simulator.provider import SimConfig, SimulatedProvider
from tests.support.http import call, problem
from tests.support.servers import RunningServer

MESSAGES = [{"role": "user", "content": "Say something short please"}]
PROMPT = "Analyze this dataset and extract key metrics"


@pytest.fixture
async def sim() -> AsyncIterator[SimulatedProvider]:
    async with SimulatedProvider(SimConfig(ttft_ms=5, tokens_per_second=2000)) as provider:
        yield provider


async def _use(server: RunningServer, http: aiohttp.ClientSession, sim: SimulatedProvider) -> None:
    body = {"name": "counted", "base_url": sim.base_url, "models": [{"name": "sim-1"}]}
    assert (await call(http, server, "POST", "/api/v1/providers", body=body)).status == 201
    agent = f"/api/v1/agents/{server.boot.agent_id}"
    config = {"provider": "counted", "model": "sim-1"}
    patched = await call(http, server, "PATCH", agent, body={"config": config})
    assert patched.status == 200, patched.text


def _relay(**fields: Any) -> dict[str, Any]:
    return {"model": "counted/sim-1", "messages": MESSAGES, **fields}


RELAY_422 = [
    _relay(messages=[]),
    _relay(messages=MESSAGES * 2001),
    _relay(max_tokens=0),
    _relay(max_tokens=1_000_001),
    _relay(max_completion_tokens=1_000_001),
    _relay(n=2),
    _relay(stream="yes"),
    _relay(stream=True, stream_options={"include_usage": True, "other": 1}),
    _relay(model="counted/" + "m" * 301),
]


def _task(**fields: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, **fields}


TASK_422 = [
    _task(prompt="x" * 2001),
    _task(prompt="short"),
    _task(title="t" * 201),
    _task(labels=[f"l{i}" for i in range(21)]),
    _task(labels=["x" * 51]),
    _task(blocked_by=[f"00000000-0000-0000-0000-{i:012d}" for i in range(51)]),
    _task(unknown_field=1),
]


async def test_over_limit_requests_are_refused_before_any_provider_call(
    server: RunningServer, http: aiohttp.ClientSession, sim: SimulatedProvider
) -> None:
    await _use(server, http, sim)
    for body in RELAY_422:
        reply = await call(http, server, "POST", "/v1/chat/completions", body=body)
        assert reply.status == 422, (body.keys(), reply.text[:300])
    too_big = {"model": "counted/sim-1", "messages": MESSAGES, "pad": "x" * (5 << 20)}
    async with http.post(
        server.base_url + "/v1/chat/completions", json=too_big, headers=server.auth
    ) as resp:
        assert resp.status == 413, await resp.text()
    for body in TASK_422:
        body = {**body, "agent_id": str(server.boot.agent_id)}
        problem(await call(http, server, "POST", "/api/v1/tasks", body=body), 422)
    big_task = {"agent_id": str(server.boot.agent_id), "prompt": PROMPT, "pad": "x" * (65 << 10)}
    async with http.post(
        server.base_url + "/api/v1/tasks", json=big_task, headers=server.auth
    ) as resp:
        assert resp.status == 413, await resp.text()
    for path in ("/api/v1/tasks?limit=101", "/api/v1/tasks?limit=0", "/api/v1/routines?limit=101"):
        problem(await call(http, server, "GET", path), 422)
    await asyncio.sleep(0.3)  # a run wrongly queued would have reached the provider by now
    assert sim.total_requests == 0

    # The same provider, within every limit, is reached: the count above could have moved.
    reply = await call(http, server, "POST", "/v1/chat/completions", body=_relay())
    assert reply.status == 200, reply.text
    assert sim.total_requests == 1
