"""The relay passes on integers of any size (found by the PostgreSQL fuzz run, BI-1).

Fields the relay does not know (and those of messages and tool calls) go to the provider as
given, as documented; an integer beyond 64 bits parsed fine but the provider body's encoder
could not write it, and the call answered 500. Now it reaches the provider as sent, which
answers for itself (the simulator accepts it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support.http import call
from tests.support.servers import RunningServer

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


@pytest.mark.parametrize("value", [HUGE, -HUGE, 2**63 - 1, -(2**63)])
async def test_an_integer_of_any_size_is_passed_on_not_a_500(
    server: RunningServer, http: aiohttp.ClientSession, value: int
) -> None:
    for body in bodies(value):
        reply = await call(http, server, "POST", URL, body=body)
        assert reply.status == 200, reply
        assert reply.body["choices"][0]["message"]["content"], reply
