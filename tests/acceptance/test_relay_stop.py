"""A stop while relay calls stream: what they used is still in the ledger.

`bullpen up` stops gracefully on SIGTERM: uvicorn lets open responses run for up to 5 s, then
cancels them, and only then shuts the application down (the ledger commits what is queued and
closes). A relayed stream still open at that point settles as it is cancelled; its row must
reach the ledger before the ledger closes, or the call's spend is lost.
"""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.app import open_store
from bullpen.settings import Settings
from bullpen.store.tables import cost_events
from tests.support.processes import bootstrap_key, bullpen_up, free_port, process_env

# Slow enough that the stream outlasts the 5 s of graceful shutdown (100 s at 5 tokens a second).
SLOW = {
    "worker_enabled": "false",
    "sim_ttft_ms": "20",
    "sim_tokens_per_second": "5",
    "sim_response_tokens": "500",
}


@pytest.mark.timeout(90)
async def test_a_stream_cut_by_a_stop_still_reaches_the_ledger(settings: Settings) -> None:
    api_key = await bootstrap_key(settings)
    port = free_port()
    body = {
        "model": "simulated/sim-1",
        "messages": [{"role": "user", "content": "Count slowly"}],
        "stream": True,
    }
    content, finished = 0, False
    with bullpen_up(process_env(settings, **SLOW), port) as server:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {api_key}"},
            ) as response,
        ):
            assert response.status == 200
            try:
                async for raw in response.content:
                    line = raw.decode().strip()
                    finished = finished or line == "data: [DONE]"
                    if '"content":"' in line and '"content":""' not in line:
                        content += 1
                        if content == 3:  # the call is well under way: stop the server
                            server.proc.send_signal(signal.SIGTERM)
            except aiohttp.ClientError:
                pass  # the server cut the stream when its graceful time ran out
        exited = await asyncio.to_thread(server.proc.wait, 30)
    assert exited in (0, -signal.SIGTERM), server.log[-2000:]
    assert not finished, "the stream was meant to be cut, not finished"
    async with open_store(settings) as store, store.read() as conn:
        rows = (await conn.execute(sa.select(cost_events.c.output_tokens))).all()
    assert len(rows) == 1, f"{len(rows)} ledger rows for one call; log: {server.log[-2000:]}"
    # Billed for what it streamed: at least the tokens this client saw.
    assert rows[0].output_tokens >= content >= 3
