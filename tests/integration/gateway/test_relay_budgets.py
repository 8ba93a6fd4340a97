"""Budgets on the relay, through the official `openai` SDK against a real server and a priced
simulator (both backends; issue 22): a key's budget refuses a call with `insufficient_quota`
before it starts or stops its stream with an in-band error, never passes the cap by more than a
slice per call in flight, and settles into the ledger exactly what the ledger records."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import UUID

import aiohttp
import openai
import pytest
import sqlalchemy as sa

from bullpen.store.tables import budget_reservations, budgets, cost_events
from tests.support.db import rows
from tests.support.http import call
from tests.support.servers import RunningServer
from tests.support.spend import USD_PER_TOKEN, make_budget, priced_provider

SLICE = 16
ANSWER = 200
MODEL = "priced/sim-1"
MESSAGES: Any = [{"role": "user", "content": "Write at length please"}]

pytestmark = pytest.mark.with_settings(
    budget_slice_tokens=SLICE,
    sim_response_tokens=ANSWER,
    # Paced like a real provider: a network read carries a token or two, not a whole answer.
    sim_tokens_per_second=100.0,
    budget_pool_idle_s=0.3,
)


async def _key(http: aiohttp.ClientSession, server: RunningServer, name: str) -> dict[str, Any]:
    created = await call(http, server, "POST", "/api/v1/api-keys", body={"name": name})
    assert created.status == 201, created.text
    return dict(created.body)


def _client(server: RunningServer, key: str) -> openai.AsyncOpenAI:
    # The SDK's default retries stay on: a budget's 429 must tell it not to retry.
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key)


async def _stream(client: openai.AsyncOpenAI) -> str:
    """One streamed call to its end; its text (raises if the stream ends in an error)."""
    chunks = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    parts = []
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


async def _settled(
    server: RunningServer, key_id: str, budget_id: str, calls: int
) -> tuple[float, Any]:
    """The key's ledger total once its `calls` rows are in and the budget's spend agrees
    with them (the relay's ledger commits moments after a call ends), and the budget row."""
    deadline = time.monotonic() + 10
    while True:
        ledger = await rows(
            server, sa.select(cost_events).where(cost_events.c.api_key_id == UUID(key_id))
        )
        total = sum(r.cost_usd for r in ledger)
        [budget] = await rows(server, sa.select(budgets).where(budgets.c.id == UUID(budget_id)))
        settled = len(ledger) == calls and budget.spent_usd == pytest.approx(total)
        if settled or time.monotonic() > deadline:
            assert len(ledger) == calls
            return total, budget
        await asyncio.sleep(0.05)


async def _given_back(server: RunningServer, budget_id: str) -> Any:
    """The budget once the idle pools were given back (nothing reserved, no reservation)."""
    deadline = time.monotonic() + 10
    while True:
        [budget] = await rows(server, sa.select(budgets).where(budgets.c.id == UUID(budget_id)))
        left = await rows(server, sa.select(budget_reservations.c.id))
        if (budget.reserved_usd < 1e-9 and not left) or time.monotonic() > deadline:
            assert left == []
            return budget
        await asyncio.sleep(0.05)


async def test_a_key_budget_stops_its_calls_with_insufficient_quota(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    key, other = await _key(http, server, "capped"), await _key(http, server, "free")
    cap = 0.5  # about two whole answers (200 tokens and the prompt at $0.001 a token)
    budget = await make_budget(
        http, server, scope="api_key", api_key_id=key["id"], amount_usd=cap, warn_percent=50
    )
    simulator = server.services.simulator
    assert simulator is not None
    whole = stopped = 0
    refused: openai.RateLimitError | None = None
    async with _client(server, key["key"]) as client:
        for _ in range(6):
            try:
                text = await _stream(client)
            except openai.RateLimitError as err:  # refused before the call started
                refused = err
                break
            except openai.APIError as err:  # stopped mid-stream: the in-band error frame
                assert err.code == "insufficient_quota", err.body
                stopped += 1
            else:
                assert text
                whole += 1
        else:
            pytest.fail("the budget never refused a call")
        asked = simulator.requests["sim-1"]
        assert refused is not None
        assert refused.status_code == 429 and refused.code == "insufficient_quota"
        assert refused.response.headers["x-should-retry"] == "false"
        body = refused.response.json()
        assert body["type"].endswith("/budget-exceeded") and body["status"] == 429
        # Not streamed either: the same refusal, and the SDK did not retry it.
        with pytest.raises(openai.RateLimitError) as again:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert again.value.code == "insufficient_quota"
        assert simulator.requests["sim-1"] == asked  # no provider was asked for either
    assert whole >= 1 and whole + stopped >= 2, (whole, stopped)

    total, after = await _settled(server, key["id"], budget["id"], whole + stopped)
    assert after.spent_usd == pytest.approx(total)
    assert cap - SLICE * USD_PER_TOKEN <= total <= cap + SLICE * USD_PER_TOKEN, total
    assert after.warned and after.exceeded
    assert (await _given_back(server, budget["id"])).spent_usd == pytest.approx(total)
    # Another key of the workspace is not covered by that budget.
    async with _client(server, other["key"]) as client:
        assert await _stream(client)


async def test_concurrent_relay_streams_never_pass_a_budget_by_more_than_a_slice_each(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await priced_provider(http, server)
    key = await _key(http, server, "crowd")
    cap = 1.0  # about four answers; 20 calls at once want five times that
    budget = await make_budget(http, server, scope="workspace", amount_usd=cap)
    async with _client(server, key["key"]) as client:
        outcomes = await asyncio.gather(
            *(_stream(client) for _ in range(20)), return_exceptions=True
        )
    codes = {getattr(o, "code", repr(o)) for o in outcomes if isinstance(o, BaseException)}
    assert codes == {"insufficient_quota"}, outcomes
    served = [o for o in outcomes if not isinstance(o, openai.RateLimitError)]
    total, after = await _settled(server, key["id"], budget["id"], len(served))
    assert after.spent_usd == pytest.approx(total)
    assert cap - SLICE * USD_PER_TOKEN <= total <= cap + 20 * SLICE * USD_PER_TOKEN, total
    assert (await _given_back(server, budget["id"])).spent_usd == pytest.approx(total)


async def test_a_caller_gone_mid_stream_pays_for_what_streamed(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """A caller that leaves after a few chunks is charged for them: closing the upstream counts
    what streamed, and that usage reaches the ledger and the key's budget."""
    await priced_provider(http, server)
    key = await _key(http, server, "leaver")
    budget = await make_budget(http, server, scope="api_key", api_key_id=key["id"], amount_usd=5.0)
    seen = 0
    async with http.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "stream": True},
        headers={"Authorization": f"Bearer {key['key']}"},
    ) as resp:
        assert resp.status == 200
        async for line in resp.content:
            seen += line.startswith(b'data: {"id"')
            if seen == 20:
                break  # leaving the block drops the connection mid-stream
    total, after = await _settled(server, key["id"], budget["id"], 1)
    [row] = await rows(
        server, sa.select(cost_events).where(cost_events.c.api_key_id == UUID(key["id"]))
    )
    assert 19 <= row.output_tokens < ANSWER, row.output_tokens
    assert total == pytest.approx(row.cost_usd) and total > 0
    assert after.spent_usd == pytest.approx(total)
