"""Helpers for agent team tests: scripted agents, tasks, waiting for their end."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID

import aiohttp
import sqlalchemy as sa

from bullpen.store.tables import runs
from tests.support.db import rows
from tests.support.servers import RunningServer


def scripted(name: str, turns: list[dict[str, Any]] | None = None) -> str:
    prompt = f"You are {name}."
    if turns is not None:
        prompt += f"\n<sim-script>{json.dumps(turns)}</sim-script>"
    return prompt


def delegate(agent: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"name": "delegate", "arguments": {"agent": agent, "prompt": prompt, **extra}}


def finish(result: str) -> dict[str, Any]:
    return {"name": "finish", "arguments": {"result": result}}


async def make_agent(
    http: aiohttp.ClientSession,
    server: RunningServer,
    name: str,
    turns: list[dict[str, Any]] | None = None,
    reports_to: str | None = None,
    **config: Any,
) -> dict[str, Any]:
    body = {
        "name": name,
        "title": name.title(),
        "config": {
            "provider": "simulated",
            "model": "sim-1",
            "system_prompt": scripted(name, turns),
            **{k: v for k, v in config.items() if k != "max_concurrent_runs"},
        },
        "reports_to": reports_to,
    }
    if "max_concurrent_runs" in config:
        body["max_concurrent_runs"] = config["max_concurrent_runs"]
    async with http.post(
        f"{server.base_url}/api/v1/agents", json=body, headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())


async def create_task(
    http: aiohttp.ClientSession,
    server: RunningServer,
    agent: dict[str, Any],
    prompt: str,
    **extra: Any,
) -> dict[str, Any]:
    async with http.post(
        f"{server.base_url}/api/v1/tasks",
        json={"prompt": prompt, "agent_id": agent["id"], **extra},
        headers=server.auth,
    ) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())


async def get_task(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str
) -> dict[str, Any]:
    async with http.get(f"{server.base_url}/api/v1/tasks/{task_id}", headers=server.auth) as resp:
        assert resp.status == 200
        return dict(await resp.json())


async def until_ended(
    http: aiohttp.ClientSession, server: RunningServer, task_id: str, timeout_s: float = 30.0
) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            task = await get_task(http, server, task_id)
            if task["status"] in ("done", "failed", "cancelled"):
                return task
            await asyncio.sleep(0.05)


async def runs_of(server: RunningServer, task_id: str) -> list[Any]:
    return await rows(
        server, sa.select(runs).where(runs.c.task_id == UUID(task_id)).order_by(runs.c.queued_at)
    )


async def faulty_provider(http: aiohttp.ClientSession, server: RunningServer) -> str:
    """A provider `faulty` on the built-in simulator that takes any model name, so an agent's
    model can carry a fault (`sim-1@hang`, `sim-1@400`, `sim-1@slow:40`)."""
    simulator = server.services.simulator
    assert simulator is not None
    body = {"name": "faulty", "base_url": simulator.base_url}
    async with http.post(
        f"{server.base_url}/api/v1/providers", json=body, headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()
    return "faulty"
