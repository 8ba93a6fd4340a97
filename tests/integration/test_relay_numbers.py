"""The relay refuses a number it could not pass on (found by the PostgreSQL fuzz run, BI-1).

Fields the relay does not know (and those of messages and tool calls) go to the provider as
given; an integer beyond 64 bits parsed fine but could not be written out again, and the call
answered 500 after the route was resolved. Now it is a 422 before any provider call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.conftest import RunningServer
from tests.integration.client import call, problem

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # no store involved

URL = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hello"}]
HUGE = 2**64  # one past the largest unsigned 64-bit integer


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def bodies(value: int) -> list[dict[str, Any]]:
    """Requests carrying `value` in each place unknown fields pass through."""
    base = {"model": "simulated/sim-1", "messages": MESSAGES}
    call_ = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {**base, "seed": value},
        {**base, "metadata": {"deep": [{"n": value}]}},
        {**base, "messages": [{**MESSAGES[0], "extra": [value]}]},
        {
            **base,
            "messages": [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{**call_, "index": value}]},
                {"role": "tool", "content": "ok", "tool_call_id": "c1"},
            ],
        },
    ]


@pytest.mark.parametrize("sign", [1, -1])
async def test_an_integer_beyond_64_bits_is_a_422_not_a_500(
    server: RunningServer, http: aiohttp.ClientSession, sign: int
) -> None:
    for body in bodies(sign * HUGE):
        reply = await call(http, server, "POST", URL, body=body)
        details = problem(reply, 422)
        assert any("64-bit" in str(error) for error in details["errors"]), details


async def test_integers_within_64_bits_still_pass_through(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for value in (2**63 - 1, -(2**63)):
        reply = await call(http, server, "POST", URL, body=bodies(value)[0])
        assert reply.status == 200, reply
