"""Spend in tests: a priced provider over the built-in simulator, and budgets made through
the API."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.servers import RunningServer

USD_PER_TOKEN = 0.001  # the priced provider: $1,000 per million tokens, in and out


async def priced_provider(http: aiohttp.ClientSession, server: RunningServer) -> None:
    simulator = server.services.simulator
    assert simulator is not None
    per_mtok = USD_PER_TOKEN * 1_000_000
    body = {
        "name": "priced",
        "base_url": simulator.base_url,
        "models": [{"name": "sim-1", "input_per_mtok": per_mtok, "output_per_mtok": per_mtok}],
    }
    async with http.post(
        f"{server.base_url}/api/v1/providers", json=body, headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()


async def make_budget(
    http: aiohttp.ClientSession, server: RunningServer, **body: Any
) -> dict[str, Any]:
    async with http.post(
        f"{server.base_url}/api/v1/budgets", json=body, headers=server.auth
    ) as resp:
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())
