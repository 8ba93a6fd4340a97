"""Bullpen behind PgBouncer in transaction mode (Debian's 1.18): an API process (`bullpen up`
without its worker) and a `bullpen worker`, both on the pooled URL for the store and the
direct URL for LISTEN/NOTIFY (docs/operations.md, "PgBouncer").

The worker polls once a minute and streams send keep-alives every 30 s here, so a run that
starts and streams to its end within the test's 20 s did so through NOTIFY: the API's
`bullpen_runs` notification woke the worker, and the worker's events reached the API's stream
over the `bullpen_events` bus. LISTEN through the pooler would leave both silent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from bullpen.app import open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import SIMULATED_MODEL, ensure_bootstrap
from bullpen.settings import Settings
from bullpen.simulator.provider import SimConfig, SimulatedProvider
from tests.support.cluster import workers
from tests.support.processes import bullpen_up, free_port, process_env
from tests.support.sse import read_events, text_of

WITHIN_S = 20.0  # well under the worker's poll and the streams' keep-alive


@dataclass
class Api:
    """The API process behind PgBouncer, with its bootstrap key and agent."""

    base_url: str
    auth: dict[str, str]
    agent_id: str


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """`bullpen up` without a worker, and a `bullpen worker`, both through PgBouncer."""
    assert settings.database_pooler == "pgbouncer"
    config = SimConfig(
        ttft_ms=20, tokens_per_second=2000, response_tokens=16, models=(SIMULATED_MODEL,)
    )
    async with SimulatedProvider(config) as sim:
        async with open_store(settings) as store:  # through the pooler, as the processes go
            boot = await ensure_bootstrap(
                store, load_secret(settings.secret_key, settings.data_dir), utcnow
            )
        assert boot.api_key is not None
        env = process_env(
            settings,
            sim_url=sim.base_url,
            database_pooler="pgbouncer",
            database_direct_url=settings.database_direct_url,
            poll_interval_s=60,
            sse_keepalive_s=30,
            workspace_poll_s=30,
        )
        port = free_port()
        with workers(env) as pool:
            pool.start(1)
            with bullpen_up({**env, "BULLPEN_WORKER_ENABLED": "false"}, port):
                yield Api(
                    f"http://127.0.0.1:{port}",
                    {"Authorization": f"Bearer {boot.api_key}"},
                    str(boot.agent_id),
                )


async def _create(http: aiohttp.ClientSession, api: Api, key: str) -> aiohttp.ClientResponse:
    body = {"prompt": f"Say something about pools {key}", "agent_id": api.agent_id}
    headers = {**api.auth, "Idempotency-Key": key}
    async with http.post(f"{api.base_url}/api/v1/tasks", json=body, headers=headers) as resp:
        await resp.read()
        return resp


async def _run_to_the_end(http: aiohttp.ClientSession, api: Api, task_id: str) -> str:
    """The task's stream read to its end: the run's text, once it ended `done`."""
    async with asyncio.timeout(WITHIN_S):
        events = await read_events(http, f"{api.base_url}/api/v1/tasks/{task_id}/events", api.auth)
    ends = [e for e in events if e.event == "end"]
    assert [e.data["status"] for e in ends] == ["done"], events
    return text_of(events)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["pgbouncer"])
async def test_tasks_run_and_stream_through_pgbouncer(
    api: Api, http: aiohttp.ClientSession
) -> None:
    key = str(uuid.uuid4())
    first = await _create(http, api, key)
    assert first.status == 201, await first.text()
    task_id = (await first.json())["id"]
    assert await _run_to_the_end(http, api, task_id)

    replay = await _create(http, api, key)
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert (await replay.json())["id"] == task_id

    # The worker is listening by now: only a NOTIFY can wake it for these in time.
    made = [await _create(http, api, str(uuid.uuid4())) for _ in range(3)]
    assert [m.status for m in made] == [201, 201, 201]
    ids = [(await m.json())["id"] for m in made]
    texts = await asyncio.gather(*(_run_to_the_end(http, api, t) for t in ids))
    assert all(texts)
