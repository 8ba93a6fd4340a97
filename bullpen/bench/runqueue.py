"""`bullpen bench --scenario queue`: what the run queue sustains, with real worker processes.

Measured from outside, as a client sees it: every database is fresh and set up by `bullpen
init`; tasks are created through the API (`POST /api/v1/tasks`, which commits the task with its
run and wakes the workers) and read back through it with their runs' own timestamps.

- **throughput**: N tasks are created while no worker runs (the API process has its worker
  off); then W `bullpen worker` processes (each with its own zero-latency simulated provider:
  no time to first token, 8 tokens at once) drain the queue. On SQLite one process holds the
  database, so the API stops and one `bullpen up` (API and worker in one process) drains it.
  Completed runs/s = N / (last finish − first start), from the runs' own timestamps, so process
  start-up is not counted.
- **claim-to-start latency** with idle workers: one task at a time is created, and the API
  wakes the workers as it always does (NOTIFY to a `bullpen worker` process on PostgreSQL; on
  SQLite the in-process signal to the worker of the same `bullpen up`); the run's
  `started_at − queued_at` is recorded.
- **freed-slot wake**: the agent may run one run at a time (`max_concurrent_runs` 1, set over
  the API); K tasks are created while no worker runs, then the worker(s) start and run them one
  after the other. Each gap between one run's `finished_at` and the next run's `started_at`
  (the runs' own timestamps, read over the API) is how long a waiting run took to start after
  the slot freed. Measured as one `bullpen up` (API and worker in one process; SQLite and
  PostgreSQL) and, on PostgreSQL, as an API-only `bullpen up` and two `bullpen worker`s.
- **noisy neighbour** (PostgreSQL): workspace B submits 8 tasks/s alone, then again while
  workspace A submits 20× that, more than the worker can run; B's queue waits are compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import aiohttp

from bullpen.bench.queueapi import QueueClient, RunTimes, second_workspace
from bullpen.bench.spawn import (
    READY_TIMEOUT_S,
    UNLIMITED,
    SpawnError,
    _admin_execute,
    _bullpen_argv,
    _create_database,
    _drop_database,
    _run_init,
    _wait_ready,
    _with_database,
    free_port,
    stop_process,
)

Backend = Literal["sqlite", "postgres"]
PROMPT = "Summarise the quarterly numbers for the team"
DEFAULT_WAKE_RUNS = 100
#: Issue 21: a waiting run starts within this long (p99) after the slot frees (PostgreSQL,
#: API + two workers).
WAKE_P99_GOAL_MS = 20
ZERO_LATENCY = {
    "BULLPEN_SIM_TTFT_MS": "0",
    "BULLPEN_SIM_TOKENS_PER_SECOND": "1000000",
    "BULLPEN_SIM_RESPONSE_TOKENS": "8",
}
# The bench fills the queue far beyond what an agent's backlog is normally allowed to hold.
_UNBOUNDED_BACKLOG = {"BULLPEN_QUEUE_MAX_BACKLOG": "10000000"}


@dataclass
class Percentiles:
    """p50/p99/max of a sample, in ms."""

    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    p95_ms: float = float("nan")

    @classmethod
    def of(cls, seconds: list[float]) -> Percentiles:
        """Summarise waits given in seconds."""
        ordered = sorted(seconds)
        if not ordered:
            return cls(0, float("nan"), float("nan"), float("nan"))

        def at(p: float) -> float:
            return 1000 * ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

        return cls(
            len(ordered), 1000 * statistics.median(ordered), at(0.99), 1000 * ordered[-1], at(0.95)
        )


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
class Wake:
    """One freed-slot wake measurement: the gaps between a run's finish and the next's start."""

    layout: str  # "one process" or "API + N workers"
    runs: int
    gaps: Percentiles
    #: Gaps left out: the next run was queued after the slot freed (no wait to measure).
    not_waiting: int
    #: Runs that started before the previous one finished: the cap of 1 did not hold.
    overlaps: int


@dataclass
class QueueReport:
    """Everything `--scenario queue` measured."""

    throughput: list[Throughput] = field(default_factory=list)
    latency: dict[str, Percentiles] = field(default_factory=dict)
    wake: dict[str, Wake] = field(default_factory=dict)
    noisy: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Seed:
    """A database and data directory as `bullpen init` left them: each measurement starts
    from a copy (one `init` per bench run, not one per measurement)."""

    data_dir: Path
    env: dict[str, str]
    database: str | None  # PostgreSQL: the template database
    boot: dict[str, Any]  # what `bullpen init --json` printed: key, agent, first admin


def _base_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BULLPEN_")}
    env.update(
        BULLPEN_DATA_DIR=str(data_dir),
        BULLPEN_SECRET_KEY=secrets.token_urlsafe(32),
        BULLPEN_HOUSEKEEPING_INTERVAL_S="3600",
        BULLPEN_DRAIN_GRACE_S="0",
        **ZERO_LATENCY,
        **UNLIMITED,
        **_UNBOUNDED_BACKLOG,
    )
    return env


@contextlib.asynccontextmanager
async def seeded(backend: Backend, pg_admin_url: str) -> AsyncIterator[Seed]:
    """A fresh database set up by `bullpen init`, removed on exit."""
    data_dir = Path(tempfile.mkdtemp(prefix="bullpen-queue-seed-"))
    env = _base_env(data_dir)
    database = None
    try:
        if backend == "postgres":
            database = await _create_database(pg_admin_url)
            env["BULLPEN_DATABASE_URL"] = _with_database(
                pg_admin_url, database, scheme="postgresql+asyncpg"
            )
        boot = await _run_init(env, data_dir, None)
        yield Seed(data_dir, env, database, boot)
    finally:
        try:
            if database is not None:
                await _drop_database(pg_admin_url, database)
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)


class Cluster:
    """A copy of the seed's database and data directory; an API process and `bullpen worker`
    processes on it, started and stopped as a measurement needs."""

    def __init__(self, backend: Backend, pg_admin_url: str, seed: Seed) -> None:
        self.backend = backend
        self.pg_admin_url = pg_admin_url
        self.seed = seed
        self.data_dir = Path(tempfile.mkdtemp(prefix="bullpen-queue-bench-"))
        self.database: str | None = None
        self.env: dict[str, str] = {}
        self.procs: list[asyncio.subprocess.Process] = []
        self.api: asyncio.subprocess.Process | None = None
        self.base_url = ""
        self.boot = seed.boot
        self._logs: list[IO[bytes]] = []

    async def __aenter__(self) -> Cluster:
        self.env = {**self.seed.env, "BULLPEN_DATA_DIR": str(self.data_dir)}
        try:
            await asyncio.to_thread(
                shutil.copytree, self.seed.data_dir, self.data_dir, dirs_exist_ok=True
            )
            if self.seed.database is not None:
                name = f"bullpen_bench_{secrets.token_hex(6)}"
                template = (f'CREATE DATABASE "{name}" TEMPLATE "{self.seed.database}"', ())
                await _admin_execute(self.pg_admin_url, template)
                self.database = name
                self.env["BULLPEN_DATABASE_URL"] = _with_database(
                    self.pg_admin_url, name, scheme="postgresql+asyncpg"
                )
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.stop_workers()
            await self.stop_api()
            if self.database is not None:
                await _drop_database(self.pg_admin_url, self.database)
        finally:
            for log in self._logs:
                log.close()
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _log(self, name: str) -> IO[bytes]:
        log = (self.data_dir / f"{name}.stderr.log").open("ab")
        self._logs.append(log)
        return log

    async def _start(self, name: str, *args: str, **extra: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *_bullpen_argv(*args),
            env={**self.env, **extra},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._log(name),
        )

    async def start_api(self, *, worker: bool, **extra: str) -> str:
        """`bullpen up` on the database, with its worker on or off; its base URL."""
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.api = await self._start(
            "api",
            *("up", "--host", "127.0.0.1", "--port", str(port), "--quiet"),
            BULLPEN_WORKER_ENABLED="true" if worker else "false",
            **extra,
        )
        await _wait_ready(
            self.api, self.base_url, self.data_dir / "api.stderr.log", READY_TIMEOUT_S
        )
        return self.base_url

    async def stop_api(self) -> None:
        """SIGTERM the API process and wait for it."""
        if self.api is not None:
            await stop_process(self.api)
            self.api = None

    def client(self, http: aiohttp.ClientSession, api_key: str | None = None) -> QueueClient:
        """A client of the API process, with the first workspace's key unless given another."""
        return QueueClient(http, self.base_url, api_key or str(self.boot["api_key"]))

    @property
    def agent_id(self) -> str:
        """The first workspace's demo agent."""
        return str(self.boot["agent_id"])

    async def start_workers(self, count: int, **extra: str) -> None:
        """Start `count` `bullpen worker` processes."""
        for _ in range(count):
            self.procs.append(await self._start(f"worker{len(self.procs)}", "worker", **extra))

    async def workers_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until every worker has said it is ready (on stderr, as it does for a person)."""
        deadline = time.monotonic() + timeout_s
        logs = [self.data_dir / f"worker{i}.stderr.log" for i in range(len(self.procs))]
        while not all(log.exists() and b"ready" in log.read_bytes() for log in logs):
            if time.monotonic() > deadline or any(p.returncode is not None for p in self.procs):
                raise SpawnError("a worker process did not start:\n" + _tail_of(logs))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # its listener connects (a run enqueued before is claimed too)

    async def stop_workers(self) -> None:
        """SIGTERM every worker and wait for it."""
        await asyncio.gather(*(stop_process(proc) for proc in self.procs))
        self.procs = []


@contextlib.asynccontextmanager
async def _cluster(
    backend: Backend, pg_admin_url: str, seed: Seed | None
) -> AsyncIterator[Cluster]:
    """A cluster on a copy of `seed` (or of a seed of its own)."""
    async with contextlib.AsyncExitStack() as stack:
        if seed is None:
            seed = await stack.enter_async_context(seeded(backend, pg_admin_url))
        yield await stack.enter_async_context(Cluster(backend, pg_admin_url, seed))


async def _wait_done(client: QueueClient, timeout_s: float) -> None:
    """Wait until no task is queued or running (or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not await client.pending() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.25)


def _tail_of(logs: list[Path]) -> str:
    return "\n".join(log.read_text(errors="replace")[-2000:] for log in logs if log.exists())


def _waits(rows: list[RunTimes]) -> list[float]:
    return [(r.started_at - r.queued_at).total_seconds() for r in rows if r.started_at]


async def measure_throughput(
    backend: Backend,
    workers: int,
    total: int,
    pg_admin_url: str,
    timeout_s: float = 300,
    *,
    seed: Seed | None = None,
) -> Throughput:
    """Pre-fill `total` runs, start `workers` processes, time the drain."""
    async with (
        _cluster(backend, pg_admin_url, seed) as cluster,
        aiohttp.ClientSession() as http,
    ):
        await cluster.start_api(worker=False)
        client = cluster.client(http)
        await client.uncap(cluster.agent_id)
        await client.create_tasks(cluster.agent_id, total, PROMPT)
        if backend == "postgres":
            await cluster.start_workers(workers)
        else:  # one process holds a SQLite database: the API's own worker drains it
            await cluster.stop_api()
            await cluster.start_api(worker=True)
            client = cluster.client(http)
        await _wait_done(client, timeout_s)
        rows = await client.runs()
        await cluster.stop_workers()
    started = min(r.started_at for r in rows if r.started_at is not None)
    finished = max(r.finished_at for r in rows if r.finished_at is not None)
    seconds = (finished - started).total_seconds()
    done = sum(1 for r in rows if r.status == "done")
    not_done = total - done
    return Throughput(backend, workers, total, seconds, done / seconds if seconds else 0, not_done)


async def measure_latency(
    backend: Backend,
    samples: int,
    pg_admin_url: str,
    gap_s: float = 0.05,
    *,
    seed: Seed | None = None,
) -> Percentiles:
    """Claim-to-start latency with idle workers: create one task at a time, record its wait."""
    async with (
        _cluster(backend, pg_admin_url, seed) as cluster,
        aiohttp.ClientSession() as http,
    ):
        if backend == "postgres":
            await asyncio.gather(cluster.start_api(worker=False), cluster.start_workers(1))
            await cluster.workers_ready()
        else:  # one process holds the database: the worker runs in the API's, as in `up`
            await cluster.start_api(worker=True)
        client = cluster.client(http)
        await client.uncap(cluster.agent_id)
        ids: list[str] = []
        for _ in range(samples):
            ids.append(await client.create_task(cluster.agent_id, PROMPT))
            await asyncio.sleep(gap_s)
        await _wait_done(client, 60)
        rows = await client.runs(ids)
        not_done = sum(1 for r in rows if r.status != "done")
        if not_done:
            raise RuntimeError(f"{not_done} runs did not finish")
        await cluster.stop_workers()
    return Percentiles.of(_waits(rows))


def wake_gaps(rows: list[RunTimes]) -> tuple[list[float], int, int]:
    """Finish-to-next-start gaps of runs that ran one at a time, in seconds; with how many
    were left out because the next run was not yet queued, and how many runs overlapped."""
    ran = sorted(
        (r for r in rows if r.started_at is not None and r.finished_at is not None),
        key=lambda r: r.started_at or r.queued_at,
    )
    gaps: list[float] = []
    not_waiting = overlaps = 0
    for previous, following in itertools.pairwise(ran):
        assert previous.finished_at is not None and following.started_at is not None
        if following.queued_at > previous.finished_at:
            not_waiting += 1
            continue
        gap = (following.started_at - previous.finished_at).total_seconds()
        if gap < 0:
            overlaps += 1
            continue
        gaps.append(gap)
    return gaps, not_waiting, overlaps


async def measure_wake(
    backend: Backend,
    runs: int,
    pg_admin_url: str,
    *,
    workers: int = 0,
    seed: Seed | None = None,
) -> Wake:
    """Freed-slot wake latency: `runs` tasks of an agent capped at one run at a time.

    With `workers` 0 one `bullpen up` (API and worker) runs them; otherwise an API-only
    `bullpen up` and that many `bullpen worker` processes (PostgreSQL). The tasks are all
    created before any worker runs, so every run but the first waits for the slot.
    """
    if workers and backend != "postgres":
        raise ValueError("worker processes beside the API need PostgreSQL")
    async with (
        _cluster(backend, pg_admin_url, seed) as cluster,
        aiohttp.ClientSession() as http,
    ):
        await cluster.start_api(worker=False)
        client = cluster.client(http)
        await client.cap(cluster.agent_id, 1)
        ids = await client.create_tasks(cluster.agent_id, runs, PROMPT)
        if workers:
            await cluster.start_workers(workers)
        else:
            await cluster.stop_api()
            await cluster.start_api(worker=True)
            client = cluster.client(http)
        # Today a waiting run may wait for the next poll (1 s): allow for that and more.
        await _wait_done(client, 60 + 2.0 * runs)
        rows = await client.runs(ids)
        await cluster.stop_workers()
    not_done = sum(1 for r in rows if r.status != "done")
    if not_done:
        raise RuntimeError(f"{not_done} of {runs} runs did not finish")
    gaps, not_waiting, overlaps = wake_gaps(rows)
    layout = f"API + {workers} workers" if workers else "one process"
    return Wake(layout, runs, Percentiles.of(gaps), not_waiting, overlaps)


async def measure_noisy_neighbour(pg_admin_url: str, *, seed: Seed | None = None) -> dict[str, Any]:
    """B's queue wait alone and while A floods the queue (one worker, 8 slots, ~60 ms runs)."""
    async with (
        _cluster("postgres", pg_admin_url, seed) as cluster,
        aiohttp.ClientSession() as http,
    ):
        worker = {
            "BULLPEN_WORKER_CONCURRENCY": "8",
            "BULLPEN_SIM_TTFT_MS": "60",
            "BULLPEN_SIM_TOKENS_PER_SECOND": "400",
            "BULLPEN_POLL_INTERVAL_S": "5",
        }
        # The worker starts beside the API; no task exists before `noisy_neighbour` submits.
        await asyncio.gather(cluster.start_api(worker=False), cluster.start_workers(1, **worker))
        a = cluster.client(http)
        await a.uncap(cluster.agent_id)
        b_key = await second_workspace(
            cluster.base_url, str(cluster.boot["email"]), str(cluster.boot["password"])
        )
        b = cluster.client(http, b_key)
        agent_b = await b.create_agent("b")
        result = await noisy_neighbour(
            start=cluster.workers_ready,
            a=(a, cluster.agent_id),
            b=(b, agent_b),
        )
        await cluster.stop_workers()
    return result


async def noisy_neighbour(
    *,
    start: Callable[[], Awaitable[None]],
    a: tuple[QueueClient, str],
    b: tuple[QueueClient, str],
    b_per_s: float = 8,
    a_factor: float = 20,
) -> dict[str, Any]:
    """B alone for 4 s, then B for 3 s while A submits `a_factor`× B's rate; waits and backlog.

    `a` and `b` are each a workspace's client and agent; `start` returns once the worker (one
    process) listens. Every task is created through the API, which wakes
    the worker.
    """

    async def submit(owner: tuple[QueueClient, str], per_s: float, seconds: float) -> list[str]:
        # Open loop: a create starts every 1/per_s whatever the last one's answer took.
        creates: list[asyncio.Task[str]] = []
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            creates.append(asyncio.create_task(owner[0].create_task(owner[1], PROMPT)))
            await asyncio.sleep(1 / per_s)
        return list(await asyncio.gather(*creates))

    async def waits(ids: list[str]) -> list[float]:
        deadline = time.monotonic() + 120
        while True:
            rows = await b[0].runs(ids)
            if all(r.status == "done" for r in rows) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        return _waits(rows)

    await start()
    alone = await waits(await submit(b, b_per_s, 4))
    flood = asyncio.create_task(submit(a, b_per_s * a_factor, 5))
    await asyncio.sleep(1)  # A's backlog has built up
    crowded = await waits(await submit(b, b_per_s, 3))
    flooded = await flood
    backlog = await a[0].count("queued")
    durations = [
        (r.finished_at - r.started_at).total_seconds()
        for r in map(RunTimes.of, await a[0].tasks("done"))
        if r.started_at is not None and r.finished_at is not None
    ]
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
    wake_runs: int = DEFAULT_WAKE_RUNS,
    on_step: Callable[[str], None] | None = None,
) -> QueueReport:
    """Throughput for each worker count, idle claim latency, the freed-slot wake (unless
    `wake_runs` is 0) and (PostgreSQL) a noisy neighbour."""
    report = QueueReport()
    say = on_step or (lambda _line: None)
    async with seeded(backend, pg_admin_url) as seed:
        for count in worker_counts:
            result = await measure_throughput(backend, count, runs_total, pg_admin_url, seed=seed)
            report.throughput.append(result)
            say(f"{count} worker(s): {result.runs_per_s:.0f} runs/s ({result.runs} runs)")
        report.latency["idle"] = await measure_latency(backend, samples, pg_admin_url, seed=seed)
        say(f"claim-to-start p50 {report.latency['idle'].p50_ms:.1f} ms")
        if wake_runs:
            for workers in (0, 2) if backend == "postgres" else (0,):
                wake = await measure_wake(
                    backend, wake_runs, pg_admin_url, workers=workers, seed=seed
                )
                report.wake[wake.layout] = wake
                say(f"freed-slot wake, {wake.layout}: p99 {wake.gaps.p99_ms:.1f} ms")
        if backend == "postgres":
            report.noisy = await measure_noisy_neighbour(pg_admin_url, seed=seed)
            say("noisy neighbour measured")
    return report


def queue_report_json(report: QueueReport, backend: Backend) -> dict[str, Any]:
    """The report as plain JSON."""
    return {
        "scenario": "queue",
        "backend": backend,
        "throughput": [vars(t) for t in report.throughput],
        "claim_to_start_ms": {k: vars(v) for k, v in report.latency.items()},
        "freed_slot_wake": [
            {
                "layout": w.layout,
                "runs": w.runs,
                "gaps_ms": vars(w.gaps),
                "not_waiting": w.not_waiting,
                "overlaps": w.overlaps,
            }
            for w in report.wake.values()
        ],
        "noisy_neighbour": {
            k: (vars(v) if isinstance(v, Percentiles) else v) for k, v in report.noisy.items()
        },
        "goals": {
            "runs_per_s_min": 500,
            "claim_to_start_p99_ms_max": 25,
            "freed_slot_wake_p99_ms_max": WAKE_P99_GOAL_MS,
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
    for w in report.wake.values():
        g = w.gaps
        lines.append(
            f"  freed-slot wake ({w.layout}, agent capped at 1 run, {w.runs} runs, {g.count} "
            f"gaps): p50 {g.p50_ms:.1f} ms, p95 {g.p95_ms:.1f} ms, p99 {g.p99_ms:.1f} ms, "
            f"max {g.max_ms:.1f} ms (goal p99 ≤ {WAKE_P99_GOAL_MS} ms on PostgreSQL, API + 2 "
            f"workers; {w.not_waiting} not waiting, {w.overlaps} overlaps)"
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
