"""A run held back by its agent's `max_concurrent_runs` starts when a slot frees, not at the
worker's poll: in one process, and with the API and two workers in three (PostgreSQL).

The poll is set to a minute, longer than each test may take, so a run that waited for it
would fail the test rather than pass slowly.
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from bullpen.app import build
from tests.support.http import call
from tests.support.servers import RunningServer
from tests.support.tasks import new_task, wait_status

pytestmark = pytest.mark.timeout(60)
SLOW_POLL = {"poll_interval_s": 60.0, "sim_ttft_ms": 20.0, "sim_response_tokens": 4}


async def _cap_agent(http: aiohttp.ClientSession, server: RunningServer, cap: int) -> None:
    path = f"/api/v1/agents/{server.boot.agent_id}"
    reply = await call(http, server, "PATCH", path, body={"max_concurrent_runs": cap})
    assert reply.status == 200, reply.body


async def _run_one_after_another(
    http: aiohttp.ClientSession, server: RunningServer, count: int
) -> list[dict[str, Any]]:
    """Create `count` tasks at once; wait for each to end; return their runs, by start."""
    tasks = [await new_task(http, server) for _ in range(count)]
    finished = [await wait_status(http, server, task["id"], "done") for task in tasks]
    runs = sorted((task["run"] for task in finished), key=lambda run: run["started_at"])
    for before, after in itertools.pairwise(runs):
        # The cap held: each run started only once the one before it had finished.
        ended = datetime.fromisoformat(before["finished_at"])
        assert datetime.fromisoformat(after["started_at"]) >= ended, (before, after)
    return runs


@pytest.mark.with_settings(**SLOW_POLL)
async def test_a_run_waiting_for_its_agents_cap_starts_when_the_slot_frees(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    await _cap_agent(http, server, 1)
    runs = await _run_one_after_another(http, server, 4)
    assert [run["attempt"] for run in runs] == [1, 1, 1, 1]


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.with_settings(worker_enabled=False, **SLOW_POLL)
async def test_a_freed_slot_wakes_the_waiting_run_across_worker_processes(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """The API process has no worker; two others (their own Services) share the queue."""
    await _cap_agent(http, server, 1)
    elsewhere = server.settings.model_copy(update={"worker_enabled": True})
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(build(elsewhere))
        runs = await _run_one_after_another(http, server, 6)
    assert [run["attempt"] for run in runs] == [1] * 6
