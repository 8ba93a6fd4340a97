"""Live event streams: a held (unread) stream, another workspace's task, the subscriber count."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from tests.support.seed import new_task as seed_task
from tests.support.seed import other_workspace
from tests.support.servers import RunningServer

SIMULATED = {"provider": "simulated", "model": "sim-1"}


async def subscribers_drop_to(server: RunningServer, count: int, within_s: float = 10.0) -> None:
    """Wait until the server holds `count` live subscribers (fails after `within_s`)."""
    bus = server.services.bus
    deadline = time.monotonic() + within_s
    while bus.subscriber_count != count:
        assert time.monotonic() < deadline, f"{bus.subscriber_count} subscribers, not {count}"
        await asyncio.sleep(0.02)


async def other_workspace_task(server: RunningServer) -> tuple[str, str, str]:
    """A second workspace with a queued task; returns (task id, its run id, a member's key)."""
    svc = server.services
    now = svc.clock()
    async with svc.store.write() as conn:
        ws, _, key = await other_workspace(conn, secret=svc.secret, now=now, role=Role.MEMBER)
        agent = await agent_store.create_agent(
            conn, workspace_id=ws, name="theirs", title="", adapter="llm", config=SIMULATED, now=now
        )
    task_id, run_id = await seed_task(svc.store, ws, agent, now)
    return str(task_id), str(run_id), key


async def open_stream(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    """A stream whose response has started (so its subscription is held), left unread."""
    resp = await http.get(url, headers={**headers, "Accept": "text/event-stream"})
    assert resp.status == 200, await resp.text()
    return resp
