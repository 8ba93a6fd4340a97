"""Fault tests' seeding: a workspace, agents and queued tasks written straight into the store.

These lived in the queue bench, which now measures from outside (over HTTP); the fault tests
still seed and read the database directly, which is what they examine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa

from bullpen.app import utcnow
from bullpen.bench.runqueue import PROMPT, Percentiles
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import Bootstrap, ensure_bootstrap
from bullpen.settings import Settings
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.tables import agents, runs

__all__ = ["bootstrap", "enqueue", "noisy_neighbour", "second_workspace"]


async def bootstrap(store: Store, settings: Settings, *, agent_cap: int = 100_000) -> Bootstrap:
    """The first workspace, key and demo agent; every agent may run `agent_cap` runs at once."""
    boot = await ensure_bootstrap(
        store, load_secret(settings.secret_key, settings.data_dir), utcnow
    )
    async with store.write() as conn:
        await conn.execute(agents.update().values(max_concurrent_runs=agent_cap))
    return boot


async def second_workspace(store: Store) -> tuple[uuid.UUID, uuid.UUID]:
    """Workspace "B" with an uncapped agent of the simulated provider: (workspace, agent)."""
    async with store.write() as conn:
        workspace_id = await identity.create_workspace(
            conn, name="B", slug="b", task_key="B", now=utcnow()
        )
        agent_id = await agent_store.create_agent(
            conn,
            workspace_id=workspace_id,
            name="b",
            title="",
            adapter="llm",
            config={"provider": "simulated", "model": "sim-1"},
            now=utcnow(),
            max_concurrent_runs=100_000,
        )
    return workspace_id, agent_id


async def enqueue(
    store: Store,
    workspace_id: uuid.UUID,
    agent_id: uuid.UUID,
    count: int,
    *,
    prompt: str = PROMPT,
    batch: int = 500,
) -> list[uuid.UUID]:
    """Commit `count` queued tasks (with their runs) straight into the store; their ids."""
    ids: list[uuid.UUID] = []
    while len(ids) < count:
        async with store.write() as conn:
            for _ in range(min(batch, count - len(ids))):
                task, _run = await task_store.insert_task_with_run(
                    conn,
                    workspace_id=workspace_id,
                    agent_id=agent_id,
                    title="bench",
                    prompt=prompt,
                    creator_user_id=None,
                    creator_key_id=None,
                    now=utcnow(),
                )
                ids.append(task.id)
    return ids


async def _times(store: Store, task_ids: list[uuid.UUID] | None = None) -> list[Any]:
    query = sa.select(runs.c.status, runs.c.queued_at, runs.c.started_at, runs.c.finished_at)
    if task_ids is not None:
        query = query.where(runs.c.task_id.in_(task_ids))
    async with store.read() as conn:
        return list(await conn.execute(query))


async def noisy_neighbour(
    store: Store,
    database_url: str,
    *,
    start: Callable[[], Awaitable[None]],
    a: tuple[uuid.UUID, uuid.UUID],
    b: tuple[uuid.UUID, uuid.UUID],
    b_per_s: float = 8,
    a_factor: float = 20,
) -> dict[str, Any]:
    """B alone for 4 s, then B for 3 s while A submits `a_factor`× B's rate; waits and backlog.

    `start` starts the worker (one process) and returns once it is ready. The bench measures
    the same over HTTP (`bullpen.bench.runqueue`); this fault test's copy seeds and reads the
    store directly.
    """
    import asyncpg

    from bullpen.queue.wakeup import CHANNEL, asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    one_at_a_time = asyncio.Lock()

    async def submit(
        owner: tuple[uuid.UUID, uuid.UUID], per_s: float, seconds: float
    ) -> list[uuid.UUID]:
        ids: list[uuid.UUID] = []
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            ids += await enqueue(store, owner[0], owner[1], 1)
            async with one_at_a_time:
                await conn.execute(f"NOTIFY {CHANNEL}")
            await asyncio.sleep(1 / per_s)
        return ids

    async def waits(ids: list[uuid.UUID]) -> list[float]:
        deadline = time.monotonic() + 120
        while True:
            rows = await _times(store, ids)
            if all(r.status == "done" for r in rows) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        return [(r.started_at - r.queued_at).total_seconds() for r in rows if r.started_at]

    try:
        await start()  # returns once the worker says it is ready
        await asyncio.sleep(0.5)  # its listener connects, as `bullpen bench` waits
        alone = await waits(await submit(b, b_per_s, 4))
        flood = asyncio.create_task(submit(a, b_per_s * a_factor, 5))
        await asyncio.sleep(1)  # A's backlog has built up
        crowded = await waits(await submit(b, b_per_s, 3))
        flooded = await flood
        async with store.read() as db:
            backlog = int(
                (
                    await db.execute(
                        sa.select(sa.func.count()).where(
                            runs.c.workspace_id == a[0], runs.c.status == "queued"
                        )
                    )
                ).scalar_one()
            )
            durations = [
                (r.finished_at - r.started_at).total_seconds()
                for r in await db.execute(
                    sa.select(runs.c.started_at, runs.c.finished_at).where(
                        runs.c.workspace_id == a[0], runs.c.status == "done"
                    )
                )
            ]
    finally:
        await conn.close()
    return {
        "b_alone": Percentiles.of(alone),
        "b_crowded": Percentiles.of(crowded),
        "a_submitted": len(flooded),
        "a_backlog_after": backlog,
        "run_s": statistics.median(durations) if durations else float("nan"),
    }
