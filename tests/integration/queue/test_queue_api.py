"""The queue seen through the API: backlog bound, retries of transient failures, dead letters,
cancellation reaching a worker in another process."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa

from bullpen.app import build
from bullpen.store import tasks as task_store
from bullpen.store.base import TURN_WIDTH
from bullpen.store.tables import agents, runs, tasks
from tests.support.db import count
from tests.support.http import call, problem
from tests.support.servers import RunningServer
from tests.support.sse import read_events
from tests.support.tasks import new_task, wait_status


@pytest.mark.with_settings(worker_enabled=False, queue_max_backlog=3)
async def test_beyond_the_backlog_creates_answer_429_and_create_nothing(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    for _ in range(3):
        await new_task(http, server)
    body = {"prompt": "one task too many here", "agent_id": str(server.boot.agent_id)}
    reply = await call(http, server, "POST", "/api/v1/tasks", body=body)
    refused = problem(reply, 429)
    assert refused["type"].endswith("/rate-limited") and "3 runs waiting" in refused["detail"]
    assert reply.headers["Retry-After"] == "5"
    assert await count(server, tasks) == 3 and await count(server, runs) == 3


@pytest.mark.with_settings(worker_enabled=False, queue_max_backlog=3)
async def test_concurrent_creates_together_never_pass_the_backlog_bound(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "one of many at once", "agent_id": str(server.boot.agent_id)}
    replies = await asyncio.gather(
        *(call(http, server, "POST", "/api/v1/tasks", body=body) for _ in range(20))
    )
    assert sorted(reply.status for reply in replies) == [201] * 3 + [429] * 17
    assert await count(server, tasks) == 3 and await count(server, runs) == 3


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "Idempotency-Key"])
@pytest.mark.with_settings(worker_enabled=False)
async def test_a_workspaces_creates_wait_their_turn_in_the_api_not_in_the_database(
    server: RunningServer, http: aiohttp.ClientSession, keyed: bool
) -> None:
    """Every create takes a number from its workspace's counter row: the API process runs at
    most TURN_WIDTH of a workspace's creates at once (issue 21), so while those turns are held
    a create waits, before it opens a transaction; another workspace's turns do not hold it."""
    store = server.services.store
    release = asyncio.Event()

    async def hold_turns(workspace_id: uuid.UUID) -> list[asyncio.Task[None]]:
        held = [asyncio.Event() for _ in range(TURN_WIDTH)]

        async def hold(ready: asyncio.Event) -> None:
            async with store.write(turn=task_store.numbering(workspace_id)):
                ready.set()
                await release.wait()

        holders = [asyncio.create_task(hold(ready)) for ready in held]
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in held)), 5)
        return holders

    async def create() -> int:
        headers = {**server.auth, "Idempotency-Key": str(uuid.uuid4())} if keyed else None
        body = {"prompt": "wait for the turn", "agent_id": str(server.boot.agent_id)}
        return (await call(http, server, "POST", "/api/v1/tasks", headers, body)).status

    holders = await hold_turns(uuid.uuid4())  # another workspace's
    assert await asyncio.wait_for(create(), 5) == 201
    release.set()
    await asyncio.gather(*holders)

    release.clear()
    holders = await hold_turns(server.boot.workspace_id)
    waiting = asyncio.create_task(create())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert await count(server, tasks) == 1
    release.set()
    await asyncio.gather(*holders)
    assert await asyncio.wait_for(waiting, 5) == 201
    assert await count(server, tasks) == 2


# The provider is a closed port: every call fails to connect, a transient failure.
@pytest.mark.with_settings(
    sim_url="http://127.0.0.1:9/v1", max_attempts=3, retry_backoff_s=0.05, retry_backoff_max_s=0.1
)
async def test_a_transient_failure_is_retried_then_dead_lettered(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    task = await new_task(http, server)
    done = await wait_status(http, server, task["id"], "failed")
    run = done["run"]
    assert (run["status"], run["attempt"], run["failures"]) == ("failed", 3, 3)
    assert run["lost_leases"] == 0  # its worker lived: no suspect of killing workers
    assert run["error"].startswith("dead-lettered after 3 failed attempts; last: provider")
    assert "could not be reached" in run["error"]
    events = await read_events(
        http, f"{server.base_url}/api/v1/tasks/{task['id']}/events", server.auth
    )
    markers = [e.data["attempt"] for e in events if e.event == "status" and "attempt" in e.data]
    assert markers == [1, 2, 3]
    assert events[-1].event == "end" and events[-1].data["status"] == "failed"


async def test_a_permanent_failure_is_not_retried(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    async with server.services.store.write() as conn:
        await conn.execute(agents.update().values(config={"provider": "simulated"}))  # no model
    task = await new_task(http, server)
    run = (await wait_status(http, server, task["id"], "failed"))["run"]
    assert (run["attempt"], run["failures"]) == (1, 0)
    assert "needs a string 'model'" in run["error"]


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.with_settings(worker_enabled=False, sim_ttft_ms=30_000.0, cancel_poll_s=0.5)
async def test_cancel_reaches_a_worker_in_another_process_within_a_second(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """The API process has no worker; the run executes in another one (its own Services)."""
    elsewhere = server.settings.model_copy(update={"worker_enabled": True})
    async with build(elsewhere) as other:
        assert other.worker is not None
        task = await new_task(http, server)
        await wait_status(http, server, task["id"], "running")
        started = time.monotonic()
        reply = await call(http, server, "POST", f"/api/v1/tasks/{task['id']}/cancel")
        took = time.monotonic() - started
        assert reply.status == 200, reply.text
        assert reply.body["status"] == "cancelled" and reply.body["run"]["status"] == "cancelled"
        assert took < 1.5, took
        assert other.worker.inflight == 0
    async with server.services.store.read() as conn:
        row = (
            await conn.execute(sa.select(runs).where(runs.c.task_id == uuid.UUID(task["id"])))
        ).one()
    assert row.cancel_requested_at is not None and row.error == "cancelled on request"


@pytest.mark.with_settings(worker_concurrency=2, worker_reserved_slots=1, poll_interval_s=30.0)
async def test_a_run_ending_frees_its_workspaces_room_at_once(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    """One workspace may use one of the two slots; each run's end claims the next without
    waiting for the (here 30 s) poll."""
    created = [await new_task(http, server) for _ in range(3)]
    started = time.monotonic()
    for task in created:
        await wait_status(http, server, task["id"], "done")
    assert time.monotonic() - started < 10


async def test_a_renewal_between_a_runs_end_and_its_task_ending_stops_nothing(
    server: RunningServer,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under load the worker's task can end well after its run's end is committed; a lease
    renewal in between finds the run no longer running. That is not a lost lease: nothing is
    stopped, nothing warned, and the run counts as completed."""
    worker = server.services.worker
    assert worker is not None
    eventlog = worker._eventlog
    commit_final = eventlog.commit_final
    renewed = []

    async def then_renew(*args: Any, **kwargs: Any) -> bool:
        applied: bool = await commit_final(*args, **kwargs)
        await worker._renew_leases()  # the lease loop's turn, before this task ends
        renewed.append(applied)
        return applied

    monkeypatch.setattr(eventlog, "commit_final", then_renew)
    before = worker.completed
    task = await new_task(http, server)
    await wait_status(http, server, task["id"], "done")
    for _ in range(200):
        if worker.inflight == 0:
            break
        await asyncio.sleep(0.01)
    assert renewed == [True]
    assert worker.completed == before + 1
    assert "lease lost" not in caplog.text
