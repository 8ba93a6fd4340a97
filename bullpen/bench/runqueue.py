"""`bullpen bench --scenario queue`: what the run queue sustains, with real worker processes.

Three measurements, each on a fresh database:
- **throughput**: N runs are enqueued before any worker starts; then W `bullpen worker`
  processes (each with its own zero-latency simulated provider: no time to first token, 8
  tokens at once) drain the queue. Completed runs/s = N / (last finish − first start), from the
  runs' own timestamps, so process start-up is not counted.
- **claim-to-start latency** with idle workers: one task at a time is enqueued (committed, then
  the workers woken as the API does: NOTIFY to a `bullpen worker` process on PostgreSQL; on
  SQLite the in-process signal to a worker in the same process, here the bench's own, as in
  `bullpen up`), and the run's `started_at − queued_at` is recorded.
- **noisy neighbour** (PostgreSQL): workspace B submits 8 tasks/s alone, then again while
  workspace A submits 20× that, more than the worker can run; B's queue waits are compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from bullpen.app import open_store, utcnow
from bullpen.bench.spawn import _create_database, _drop_database, _with_database
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import Bootstrap, ensure_bootstrap
from bullpen.settings import Settings
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store import tasks as task_store
from bullpen.store.base import Store
from bullpen.store.tables import agents, runs

Backend = Literal["sqlite", "postgres"]
PROMPT = "Summarise the quarterly numbers for the team"
ZERO_LATENCY = {
    "BULLPEN_SIM_TTFT_MS": "0",
    "BULLPEN_SIM_TOKENS_PER_SECOND": "1000000",
    "BULLPEN_SIM_RESPONSE_TOKENS": "8",
}


@dataclass
class Percentiles:
    """p50/p99/max of a sample, in ms."""

    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> Percentiles:
        """Summarise waits given in seconds."""
        ordered = sorted(seconds)
        if not ordered:
            return cls(0, float("nan"), float("nan"), float("nan"))
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return cls(len(ordered), 1000 * statistics.median(ordered), 1000 * p99, 1000 * ordered[-1])


@dataclass
class Throughput:
    """One throughput measurement."""

    backend: Backend
    workers: int
    runs: int
    seconds: float
    runs_per_s: float
    not_done: int


@dataclass
class QueueReport:
    """Everything `--scenario queue` measured."""

    throughput: list[Throughput] = field(default_factory=list)
    latency: dict[str, Percentiles] = field(default_factory=dict)
    noisy: dict[str, Any] = field(default_factory=dict)


class Cluster:
    """A fresh database (and data directory), the bench's own store on it, and workers."""

    def __init__(self, backend: Backend, pg_admin_url: str) -> None:
        self.backend = backend
        self.pg_admin_url = pg_admin_url
        self.data_dir = Path(tempfile.mkdtemp(prefix="bullpen-queue-bench-"))
        self.database: str | None = None
        self.env: dict[str, str] = {}
        self.procs: list[asyncio.subprocess.Process] = []
        self.settings: Settings | None = None

    async def __aenter__(self) -> Cluster:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
        env.update(
            BULLPEN_DATA_DIR=str(self.data_dir),
            BULLPEN_SECRET_KEY=secrets.token_urlsafe(32),
            BULLPEN_HOUSEKEEPING_INTERVAL_S="3600",
            BULLPEN_DRAIN_GRACE_S="0",
            **ZERO_LATENCY,
        )
        if self.backend == "postgres":
            self.database = await _create_database(self.pg_admin_url)
            env["BULLPEN_DATABASE_URL"] = _with_database(
                self.pg_admin_url, self.database, scheme="postgresql+asyncpg"
            )
        self.env = env
        self.settings = Settings(
            data_dir=self.data_dir,
            secret_key=env["BULLPEN_SECRET_KEY"],
            database_url=env.get("BULLPEN_DATABASE_URL"),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop_workers()
            if self.database is not None:
                await _drop_database(self.pg_admin_url, self.database)
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    @contextlib.asynccontextmanager
    async def store(self) -> AsyncIterator[Store]:
        """The bench's own store on the database (for SQLite: while no worker holds it)."""
        assert self.settings is not None
        async with open_store(self.settings) as store:
            yield store

    async def start_workers(self, count: int, **extra: str) -> None:
        """Start `count` `bullpen worker` processes."""
        env = {**self.env, **extra}
        for _ in range(count):
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bullpen",
                    "worker",
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            )

    async def stop_workers(self) -> None:
        """SIGTERM every worker and wait for it."""
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.procs = []


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


async def _wait_done(store: Store, total: int, timeout_s: float) -> int:
    """Wait until `total` runs are done (or time runs out); returns how many are not."""
    deadline = time.monotonic() + timeout_s
    while True:
        async with store.read() as conn:
            done = (
                await conn.execute(
                    sa.select(sa.func.count()).select_from(runs).where(runs.c.status == "done")
                )
            ).scalar_one()
        if done >= total or time.monotonic() > deadline:
            return int(total - done)
        await asyncio.sleep(0.25)


async def measure_throughput(
    backend: Backend, workers: int, total: int, pg_admin_url: str, timeout_s: float = 300
) -> Throughput:
    """Pre-fill `total` runs, start `workers` processes, time the drain."""
    async with Cluster(backend, pg_admin_url) as cluster:
        assert cluster.settings is not None
        async with cluster.store() as store:
            boot = await bootstrap(store, cluster.settings)
            await enqueue(store, boot.workspace_id, boot.agent_id, total)
        await cluster.start_workers(workers)
        reader = _reader(cluster)
        async with reader as store:
            not_done = await _wait_done(store, total, timeout_s)
            rows = await _times(store)
        await cluster.stop_workers()
    started = min(r.started_at for r in rows if r.started_at is not None)
    finished = max(r.finished_at for r in rows if r.finished_at is not None)
    seconds = (finished - started).total_seconds()
    done = sum(1 for r in rows if r.status == "done")
    return Throughput(backend, workers, total, seconds, done / seconds if seconds else 0, not_done)


def _reader(cluster: Cluster) -> contextlib.AbstractAsyncContextManager[Store]:
    """A store for reading while workers run (SQLite: without claiming the file's lock)."""
    assert cluster.settings is not None
    if cluster.backend == "postgres":
        return cluster.store()
    from bullpen.store.engine import create_store

    @contextlib.asynccontextmanager
    async def unlocked() -> AsyncIterator[Store]:
        assert cluster.settings is not None
        store = create_store(cluster.settings)
        try:
            yield store
        finally:
            await store.close()

    return unlocked()


async def measure_latency(
    backend: Backend, samples: int, pg_admin_url: str, gap_s: float = 0.05
) -> Percentiles:
    """Claim-to-start latency with idle workers: enqueue one run at a time, wake, record."""
    async with Cluster(backend, pg_admin_url) as cluster:
        assert cluster.settings is not None
        if backend == "postgres":
            async with cluster.store() as store:
                boot = await bootstrap(store, cluster.settings)
            await cluster.start_workers(1)
            async with cluster.store() as store:
                waits = await _one_at_a_time(store, cluster, boot, samples, gap_s)
            await cluster.stop_workers()
            return Percentiles.of(waits)
        # SQLite: one process holds the database; run the worker in this process, as `up` does.
        from bullpen.app import build

        async with build(cluster.settings.model_copy(update=_in_process())) as services:
            boot = await bootstrap(services.store, cluster.settings)
            assert services.worker is not None
            waits = await _one_at_a_time(
                services.store, None, boot, samples, gap_s, services.worker.notify
            )
        return Percentiles.of(waits)


def _in_process() -> dict[str, Any]:
    return {
        "worker_enabled": True,
        "sim_ttft_ms": 0.0,
        "sim_tokens_per_second": 1_000_000.0,
        "sim_response_tokens": 8,
        "drain_grace_s": 0.0,
    }


async def _one_at_a_time(
    store: Store,
    cluster: Cluster | None,
    boot: Bootstrap,
    samples: int,
    gap_s: float,
    wake_in_process: Callable[[], None] | None = None,
) -> list[float]:
    notify: Callable[[], Awaitable[None]]
    if cluster is not None:
        import asyncpg

        from bullpen.queue.wakeup import CHANNEL, asyncpg_dsn

        assert cluster.settings is not None and cluster.settings.database_url is not None
        conn = await asyncpg.connect(asyncpg_dsn(cluster.settings.database_url))

        async def send() -> None:
            await conn.execute(f"NOTIFY {CHANNEL}")

        notify = send
        await asyncio.sleep(5)  # the worker process starts and listens
    else:
        conn = None

        async def wake() -> None:
            assert wake_in_process is not None
            wake_in_process()  # what the API does after the create commits

        notify = wake
    ids: list[uuid.UUID] = []
    try:
        for _ in range(samples):
            ids += await enqueue(store, boot.workspace_id, boot.agent_id, 1)
            await notify()
            await asyncio.sleep(gap_s)
        not_done = await _wait_done(store, samples, 60)
        if not_done:
            raise RuntimeError(f"{not_done} runs did not finish")
    finally:
        if conn is not None:
            await conn.close()
    return [(r.started_at - r.queued_at).total_seconds() for r in await _times(store, ids)]


async def measure_noisy_neighbour(pg_admin_url: str) -> dict[str, Any]:
    """B's queue wait alone and while A floods the queue (one worker, 8 slots, ~60 ms runs)."""
    async with Cluster("postgres", pg_admin_url) as cluster:
        assert cluster.settings is not None and cluster.settings.database_url is not None
        async with cluster.store() as store:
            boot = await bootstrap(store, cluster.settings)
            ws_b, agent_b = await second_workspace(store)
            result = await noisy_neighbour(
                store,
                cluster.settings.database_url,
                start=lambda: cluster.start_workers(
                    1,
                    BULLPEN_WORKER_CONCURRENCY="8",
                    BULLPEN_SIM_TTFT_MS="60",
                    BULLPEN_SIM_TOKENS_PER_SECOND="400",
                    BULLPEN_POLL_INTERVAL_S="5",
                ),
                a=(boot.workspace_id, boot.agent_id),
                b=(ws_b, agent_b),
            )
        await cluster.stop_workers()
    return result


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

    Shared by the bench and the fault test. `start` starts the worker (one process).
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
        await start()
        await asyncio.sleep(5)  # the worker is up and listening
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


async def run_queue_bench(
    backend: Backend,
    *,
    runs_total: int,
    worker_counts: list[int],
    samples: int,
    pg_admin_url: str,
    on_step: Callable[[str], None] | None = None,
) -> QueueReport:
    """Throughput for each worker count, idle claim latency and (PostgreSQL) a noisy neighbour."""
    report = QueueReport()
    say = on_step or (lambda _line: None)
    for count in worker_counts:
        result = await measure_throughput(backend, count, runs_total, pg_admin_url)
        report.throughput.append(result)
        say(f"{count} worker(s): {result.runs_per_s:.0f} runs/s ({result.runs} runs)")
    report.latency["idle"] = await measure_latency(backend, samples, pg_admin_url)
    say(f"claim-to-start p50 {report.latency['idle'].p50_ms:.1f} ms")
    if backend == "postgres":
        report.noisy = await measure_noisy_neighbour(pg_admin_url)
        say("noisy neighbour measured")
    return report


def queue_report_json(report: QueueReport, backend: Backend) -> dict[str, Any]:
    """The report as plain JSON."""
    return {
        "scenario": "queue",
        "backend": backend,
        "throughput": [vars(t) for t in report.throughput],
        "claim_to_start_ms": {k: vars(v) for k, v in report.latency.items()},
        "noisy_neighbour": {
            k: (vars(v) if isinstance(v, Percentiles) else v) for k, v in report.noisy.items()
        },
        "goals": {
            "runs_per_s_min": 500,
            "claim_to_start_p99_ms_max": 25,
        },
    }


def queue_report_lines(report: QueueReport, backend: Backend) -> list[str]:
    """The report as lines of text."""
    lines = [f"bullpen bench queue — {backend}, zero-latency simulator in each worker process"]
    for t in report.throughput:
        lines.append(
            f"  throughput, {t.workers} worker process(es): {t.runs_per_s:.0f} runs/s "
            f"({t.runs} runs in {t.seconds:.1f} s, {t.not_done} not done)"
        )
    for name, p in report.latency.items():
        lines.append(
            f"  claim-to-start ({name} workers, {p.count} runs): p50 {p.p50_ms:.1f} ms, "
            f"p99 {p.p99_ms:.1f} ms, max {p.max_ms:.1f} ms"
        )
    if report.noisy:
        alone, crowded = report.noisy["b_alone"], report.noisy["b_crowded"]
        lines.append(
            f"  noisy neighbour: B's queue wait alone p50 {alone.p50_ms:.1f} / p99 "
            f"{alone.p99_ms:.1f} ms; while A submits 20× (backlog "
            f"{report.noisy['a_backlog_after']}) p50 {crowded.p50_ms:.1f} / p99 "
            f"{crowded.p99_ms:.1f} ms; one run takes {1000 * report.noisy['run_s']:.0f} ms"
        )
    return lines
