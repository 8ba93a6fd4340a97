"""Tasks through the API: create one for the bootstrap agent, wait for a status, and the text
the simulated provider answers a prompt with."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from bullpen.agents.llm import DEFAULT_SYSTEM_PROMPT
from bullpen.simulator.provider import completion_tokens
from tests.support.http import call
from tests.support.servers import RunningServer

PROMPT = "Analyze this dataset and extract key metrics"


def expected_text(server: RunningServer, prompt: str) -> str:
    messages = [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]
    return "".join(completion_tokens(messages, server.settings.sim_response_tokens))


async def new_task(
    http: aiohttp.ClientSession, server: RunningServer, **fields: Any
) -> dict[str, Any]:
    body = {"prompt": PROMPT, "agent_id": str(server.boot.agent_id), **fields}
    reply = await call(http, server, "POST", "/api/v1/tasks", body=body)
    assert reply.status == 201, reply.text
    task: dict[str, Any] = reply.body
    return task


async def wait_status(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str, status: str
) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while True:
        task = (await call(http, server, "GET", f"/api/v1/tasks/{task_id}")).body
        if task["status"] == status or time.monotonic() > deadline:
            assert task["status"] == status, task
            return dict(task)
        await asyncio.sleep(0.05)
