"""Relay keys' requests and tokens per minute, through the official `openai` SDK against a real
server and the built-in simulator (both backends)."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from tests.support.db import audits
from tests.support.http import call, problem
from tests.support.servers import RunningServer

MESSAGES: Any = [{"role": "user", "content": "Say something short please"}]
# The simulator's 24 tokens (FAST_SIM) plus the prompt (4 words + 3): 31 tokens a call; the
# relay's prompt estimate of the same message is 7 + 4 = 11 tokens.
CALL_TOKENS = 31


async def _key(
    http: aiohttp.ClientSession, server: RunningServer, name: str, **limits: Any
) -> dict[str, Any]:
    created = await call(http, server, "POST", "/api/v1/api-keys", body={"name": name, **limits})
    assert created.status == 201, created.text
    return dict(created.body)


def _client(server: RunningServer, key: str) -> openai.AsyncOpenAI:
    # No retries: the SDK would wait out Retry-After itself and hide the 429.
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


async def _complete(client: openai.AsyncOpenAI, *, stream: bool = False) -> int:
    """One call; the tokens its usage reports."""
    if stream:
        chunks = await client.chat.completions.create(
            model="simulated/sim-1",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        total = 0
        async for chunk in chunks:
            if chunk.usage is not None:
                total = chunk.usage.total_tokens
        return total
    completion = await client.chat.completions.create(model="simulated/sim-1", messages=MESSAGES)
    assert completion.usage is not None
    return completion.usage.total_tokens


def _check_rate_limited(err: openai.RateLimitError, kind: str) -> int:
    assert err.status_code == 429
    assert err.code == "rate_limit_exceeded" and err.type == kind, err.body
    body = err.response.json()
    assert body["type"].endswith("/key-rate-limited") and body["status"] == 429
    assert body["error"]["message"] == body["detail"]
    retry_after = int(err.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    return retry_after


async def test_a_key_over_its_tokens_per_minute_gets_429_with_retry_after(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    limited = await _key(http, server, "tpm", tpm_limit=2 * CALL_TOKENS)
    assert limited["tpm_limit"] == 2 * CALL_TOKENS and limited["rpm_limit"] is None
    free = await _key(http, server, "no limits")
    async with _client(server, limited["key"]) as client, _client(server, free["key"]) as other:
        assert await _complete(client, stream=True) == CALL_TOKENS
        assert await _complete(client) == CALL_TOKENS  # 31 used, + ~11 asked: fits in 62
        with pytest.raises(openai.RateLimitError) as over:  # 62 used: nothing more fits
            await _complete(client)
        _check_rate_limited(over.value, "tokens")
        assert "tokens per minute" in over.value.message
        with pytest.raises(openai.RateLimitError):
            await _complete(client, stream=True)
        # A key without limits is not affected.
        for _ in range(5):
            assert await _complete(other) == CALL_TOKENS


async def test_a_key_over_its_requests_per_minute_gets_429_with_retry_after(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    limited = await _key(http, server, "rpm", rpm_limit=3)
    free = await _key(http, server, "no limits")
    async with _client(server, limited["key"]) as client, _client(server, free["key"]) as other:
        for _ in range(3):
            await _complete(client)
        with pytest.raises(openai.RateLimitError) as over:
            await _complete(client, stream=True)
        retry_after = _check_rate_limited(over.value, "requests")
        assert retry_after >= 55  # the first of the three left only moments ago
        for _ in range(6):
            await _complete(other)

        # Limits change through the API and apply to the next call in this process.
        url = f"/api/v1/api-keys/{free['id']}"
        changed = await call(http, server, "PATCH", url, body={"rpm_limit": 2})
        assert changed.status == 200, changed.text
        assert changed.body["rpm_limit"] == 2 and changed.body["tpm_limit"] is None
        # A key without limits keeps no window: its calls count from when a limit is set.
        await _complete(other)
        await _complete(other)
        with pytest.raises(openai.RateLimitError):
            await _complete(other)
        lifted = await call(http, server, "PATCH", url, body={"rpm_limit": None})
        assert lifted.status == 200 and lifted.body["rpm_limit"] is None
        await _complete(other)
    (update, _) = [e for e in await audits(server, "api_key.update")]
    assert update.data["before"] == {"rpm_limit": None} and update.data["after"] == {"rpm_limit": 2}
    assert "key" not in update.data and free["key"] not in str(update.data)


async def test_key_limits_are_validated(server: RunningServer, http: aiohttp.ClientSession) -> None:
    for bad in (0, -1, 1.5, "10", True, 10**10):
        for field in ("rpm_limit", "tpm_limit"):
            created = await call(
                http, server, "POST", "/api/v1/api-keys", body={"name": "bad", field: bad}
            )
            problem(created, 422)
    key = await _key(http, server, "ok", rpm_limit=1, tpm_limit=1_000_000_000)
    url = f"/api/v1/api-keys/{key['id']}"
    problem(await call(http, server, "PATCH", url, body={"rpm_limit": 0}), 422)
    problem(await call(http, server, "PATCH", url, body={"name": "renamed"}), 422)
    problem(await call(http, server, "PATCH", url, body={"tpm_limit": "many"}), 422)
    missing = "/api/v1/api-keys/00000000-0000-4000-8000-000000000000"
    problem(await call(http, server, "PATCH", missing, body={"rpm_limit": 5}), 404)
