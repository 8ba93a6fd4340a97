"""`bullpen bench --scenario streams`: how many live task streams one API process holds.

On PostgreSQL: one `bullpen up` (API only) and one `bullpen worker`, on a scratch database,
with events crossing between them on the configured bus (NOTIFY, or Redis Streams with
`--bus redis`); on SQLite: one `bullpen up` that is API and worker at once. The simulator runs
in its own process at 20 tokens/s and stamps every token with the time it sent it, so the load
client (this process) can time each token from the provider's emit to its own receipt.

For each level N the client creates N tasks (long answers, so they are all still streaming
later), opens each task's event stream as soon as it is created, waits until every stream has
received text, then measures for `hold_s` seconds: delivery latency of every token received,
the streams that received text, each process's CPU and resident memory, and the database's
commits and inserted rows per second. Then it cancels the tasks and waits for their streams to
close before the next level.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from bullpen.bench.createload import read_cpu_s
from bullpen.bench.loadgen import SSEParser
from bullpen.bench.report import percentile
from bullpen.bench.spawn import (
    NO_RUN_RATE_BREAKER,
    SpawnedServer,
    SpawnError,
    agent_run_cap,
    raise_run_cap,
    spawn_server,
)

Backend = Literal["sqlite", "postgres"]
BusKind = Literal["postgres", "redis"]
PROMPT = "Stream a long answer for the live streams benchmark"
TOKENS_PER_SECOND = 20
_MESSAGES = [{"role": "user", "content": PROMPT}]
_CREATE_CONCURRENCY = 32
_CLOSE_TIMEOUT_S = 60.0


@dataclass
class StreamsLevel:
    """What one level measured."""

    streams: int
    hold_s: float
    ramp_s: float = 0.0
    live: int = 0  # streams that received text during the hold
    latencies_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    text_events: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    cpu_cores: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    db_commits_per_s: float | None = None
    db_rows_per_s: float | None = None
    # The same number of streams read from the simulator directly, measured just before.
    direct: StreamsLevel | None = None

    def summary(self) -> dict[str, Any]:
        """The figures as JSON."""
        ordered = sorted(self.latencies_ms)

        def pct(q: float) -> float | None:
            value = percentile(ordered, q)
            return round(value, 1) if value is not None else None

        bullpen_rss = sum(v for k, v in self.rss_mb.items() if k in ("api", "worker"))
        return {
            "streams": self.streams,
            "live": self.live,
            "ramp_s": round(self.ramp_s, 1),
            "hold_s": self.hold_s,
            "delivery_p50_ms": pct(50),
            "delivery_p99_ms": pct(99),
            "delivery_max_ms": round(ordered[-1], 1) if ordered else None,
            "tokens_per_s": round(self.tokens / self.hold_s, 1),
            "text_events_per_s": round(self.text_events / self.hold_s, 1),
            "bullpen_rss_mb": round(bullpen_rss, 1),
            "rss_mb": {k: round(v, 1) for k, v in self.rss_mb.items()},
            "cpu_cores": {k: round(v, 2) for k, v in self.cpu_cores.items()},
            "db_commits_per_s": _round(self.db_commits_per_s),
            "db_rows_per_s": _round(self.db_rows_per_s),
            "errors": dict(self.errors),
            "direct": self.direct.summary() if self.direct is not None else None,
        }


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Watcher:
    """One task's stream: counts tokens and, during the hold, their delivery latency."""

    __slots__ = ("closed", "got_text", "level", "measuring", "texted_in_hold")

    def __init__(self, level: StreamsLevel) -> None:
        self.level = level
        self.got_text = asyncio.Event()
        self.closed = asyncio.Event()
        self.measuring = False
        self.texted_in_hold = False

    def text(self, text: str, received: float) -> None:
        self.got_text.set()
        if not self.measuring:
            return
        self.texted_in_hold = True
        level = self.level
        level.text_events += 1
        for piece in text.split(";"):
            if piece.startswith("@"):
                level.tokens += 1
                level.latencies_ms.append((received - float(piece[1:])) * 1000)


async def _follow(
    request: Any, watcher: _Watcher, label: str, handle: Callable[[str, bytes, float], bool]
) -> None:
    """Read one SSE response (`request`: an aiohttp request context) until `handle(kind, data,
    received)` says it ended; failures count as `<label>_…` errors."""
    errors = watcher.level.errors
    try:
        async with request as resp:
            if resp.status != 200:
                errors[f"{label}_http_{resp.status}"] += 1
                return
            parser = SSEParser()
            async for chunk in resp.content.iter_any():
                received = time.time()
                for _id, kind, data in parser.feed(chunk):
                    if handle(kind, data, received):
                        return
    except (aiohttp.ClientError, TimeoutError) as err:
        errors[f"{label}_{type(err).__name__}"] += 1
    finally:
        watcher.closed.set()


async def _watch(
    http: aiohttp.ClientSession, server: SpawnedServer, task_id: str, watcher: _Watcher
) -> None:
    """One task's event stream from Bullpen."""

    def handle(kind: str, data: bytes, received: float) -> bool:
        if kind == "text":
            watcher.text(orjson.loads(data)["text"], received)
        return kind == "close"

    headers = {"Authorization": f"Bearer {server.api_key}", "Accept": "text/event-stream"}
    url = f"{server.base_url}/api/v1/tasks/{task_id}/events"
    await _follow(http.get(url, headers=headers), watcher, "stream", handle)


async def _watch_direct(http: aiohttp.ClientSession, sim_url: str, watcher: _Watcher) -> None:
    """One completion streamed from the simulator itself, as a Bullpen worker would ask for it."""

    def handle(_kind: str, data: bytes, received: float) -> bool:
        if data == b"[DONE]":
            return True
        choices = orjson.loads(data)["choices"]
        content = choices[0]["delta"].get("content") if choices else None
        if content:
            watcher.text(content, received)
        return False

    body = orjson.dumps({"model": "sim-1", "messages": _MESSAGES, "stream": True})
    request = http.post(
        f"{sim_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    await _follow(request, watcher, "direct", handle)


async def _post(
    http: aiohttp.ClientSession, server: SpawnedServer, path: str, body: object | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {server.api_key}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    async with http.post(
        server.base_url + path,
        data=orjson.dumps(body) if body is not None else None,
        headers=headers,
    ) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if raw else None


async def _agents(http: aiohttp.ClientSession, server: SpawnedServer, runs: int) -> list[str]:
    """Agents enough to run `runs` streams at once (each may run at most the API's cap, read
    from its OpenAPI document): the bench's own agent, raised to the cap, and copies of it."""
    headers = {"Authorization": f"Bearer {server.api_key}", "Content-Type": "application/json"}
    url = f"{server.base_url}/api/v1/agents"
    max_agent_runs = await agent_run_cap(http, server.base_url)
    async with http.get(f"{url}/{server.agent_id}", headers=headers) as resp:
        if resp.status != 200:
            raise SpawnError(f"could not read the bench agent: {await resp.text()}")
        config = (await resp.json())["config"]
    cap = {"max_concurrent_runs": max_agent_runs}
    await raise_run_cap(http, server, max_agent_runs)
    ids = [server.agent_id]
    for i in range(1, -(-runs // max_agent_runs)):
        body = {"name": f"streams-bench-{i}", "config": config, **cap, **NO_RUN_RATE_BREAKER}
        async with http.post(url, data=orjson.dumps(body), headers=headers) as resp:
            if resp.status != 201:
                raise SpawnError(f"could not create a bench agent: {await resp.text()}")
            ids.append((await resp.json())["id"])
    return ids


async def _bounded(items: Sequence[Any], action: Callable[[Any], Any], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(item: Any) -> None:
        async with gate:
            await action(item)

    await asyncio.gather(*(one(item) for item in items))


class _DbStats:
    """Commits and inserted rows of the scratch database (PostgreSQL's statistics)."""

    def __init__(self, database_url: str | None) -> None:
        self._dsn = (
            database_url.replace("postgresql+asyncpg://", "postgresql://", 1)
            if database_url
            else None
        )

    async def read(self) -> tuple[float, float] | None:
        if self._dsn is None:
            return None
        import asyncpg

        conn = await asyncpg.connect(self._dsn)
        try:
            # Statistics are flushed lazily; ask for a fresh snapshot of them.
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            row = await conn.fetchrow(
                "SELECT xact_commit, tup_inserted FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
        finally:
            await conn.close()
        return (float(row["xact_commit"]), float(row["tup_inserted"])) if row else None


async def _level(
    http: aiohttp.ClientSession,
    server: SpawnedServer,
    agents: list[str],
    streams: int,
    hold_s: float,
    ramp_timeout_s: float,
    on_step: Callable[[str], None],
) -> StreamsLevel:
    level = StreamsLevel(streams, hold_s)
    task_ids: list[str] = []
    watchers: list[_Watcher] = []
    readers: list[asyncio.Task[None]] = []
    started = time.monotonic()

    async def create(i: int) -> None:
        agent = agents[i % len(agents)]
        status, body = await _post(
            http, server, "/api/v1/tasks", {"prompt": PROMPT, "agent_id": agent}
        )
        if status != 201:
            level.errors[f"create_http_{status}"] += 1
            return
        task_ids.append(body["id"])
        watcher = _Watcher(level)
        watchers.append(watcher)
        readers.append(asyncio.create_task(_watch(http, server, body["id"], watcher)))

    try:
        await _bounded(range(streams), create, _CREATE_CONCURRENCY)
        on_step(f"{streams} streams: {len(task_ids)} tasks created, waiting for text")
        await _ramp_and_hold(server, level, watchers, started, ramp_timeout_s, "streams", on_step)
    finally:
        for watcher in watchers:
            watcher.measuring = False

        async def cancel(task_id: str) -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await _post(http, server, f"/api/v1/tasks/{task_id}/cancel")

        await _bounded(task_ids, cancel, _CREATE_CONCURRENCY)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await asyncio.gather(*(w.closed.wait() for w in watchers))
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return level


async def _direct_level(
    http: aiohttp.ClientSession,
    server: SpawnedServer,
    streams: int,
    hold_s: float,
    ramp_timeout_s: float,
    on_step: Callable[[str], None],
) -> StreamsLevel:
    """The baseline: the load client streams N completions from the simulator directly, with no
    Bullpen in between; what the simulator and the client cost on their own."""
    assert server.sim_url is not None
    level = StreamsLevel(streams, hold_s)
    watchers = [_Watcher(level) for _ in range(streams)]
    started = time.monotonic()
    readers = [asyncio.create_task(_watch_direct(http, server.sim_url, w)) for w in watchers]
    try:
        label = "direct streams"
        await _ramp_and_hold(server, level, watchers, started, ramp_timeout_s, label, on_step)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return level


async def _ramp_and_hold(
    server: SpawnedServer,
    level: StreamsLevel,
    watchers: list[_Watcher],
    started: float,
    ramp_timeout_s: float,
    label: str,
    on_step: Callable[[str], None],
) -> None:
    """Wait until every stream has text (or the ramp times out), then measure the hold."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(ramp_timeout_s):
            await asyncio.gather(*(w.got_text.wait() for w in watchers))
    level.ramp_s = time.monotonic() - started
    streaming = sum(w.got_text.is_set() for w in watchers)
    on_step(f"{level.streams} {label}: {streaming} streaming after {level.ramp_s:.0f} s; measuring")
    await _measure(server, level, watchers, level.hold_s)
    level.live = sum(w.texted_in_hold for w in watchers)


async def _measure(
    server: SpawnedServer, level: StreamsLevel, watchers: list[_Watcher], hold_s: float
) -> None:
    pids = {"api": server.pid, "worker": next(iter(server.worker_pids), None)}
    pids["simulator"] = server.sim_pid
    pids["client"] = None  # this process
    db = _DbStats(server.database_url)

    def cpu() -> dict[str, float]:
        import os

        out = {k: read_cpu_s(p) for k, p in pids.items() if p is not None}
        times = os.times()
        out["client"] = times.user + times.system
        return {k: v for k, v in out.items() if v is not None}

    db_before = await db.read()
    cpu_before = cpu()
    began = time.monotonic()
    for watcher in watchers:
        watcher.measuring = True
    await asyncio.sleep(hold_s)
    for watcher in watchers:
        watcher.measuring = False
    elapsed = time.monotonic() - began
    cpu_after = cpu()
    db_after = await db.read()
    level.cpu_cores = {
        k: (cpu_after[k] - cpu_before[k]) / elapsed for k in cpu_after if k in cpu_before
    }
    level.rss_mb = {k: _rss_mb(p) for k, p in pids.items() if p is not None}
    import resource

    level.rss_mb["client"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if db_before is not None and db_after is not None:
        level.db_commits_per_s = (db_after[0] - db_before[0]) / elapsed
        level.db_rows_per_s = (db_after[1] - db_before[1]) / elapsed


async def run_streams_bench(
    backend: Backend,
    *,
    bus: BusKind = "postgres",
    redis_url: str = "redis://127.0.0.1:6379/0",
    pg_admin_url: str,
    levels: Sequence[int] = (500, 1000, 2000),
    hold_s: float = 20.0,
    ramp_timeout_s: float = 90.0,
    on_step: Callable[[str], None] = lambda _line: None,
) -> list[StreamsLevel]:
    """Measure every level in turn on one set of processes."""
    top = max(levels)
    # Long answers: every stream is still going through its ramp and the hold.
    answer_tokens = int(TOKENS_PER_SECOND * (ramp_timeout_s + hold_s + 30))
    env = {
        "BULLPEN_SIM_TTFT_MS": "100",
        "BULLPEN_SIM_TOKENS_PER_SECOND": str(TOKENS_PER_SECOND),
        "BULLPEN_SIM_RESPONSE_TOKENS": str(answer_tokens),
        "BULLPEN_SIM_FAULT": "stamp",
        "BULLPEN_RATE_LIMIT_KEY_RPS": "1000000",
        "BULLPEN_RATE_LIMIT_KEY_BURST": "1000000",
        "BULLPEN_RATE_LIMIT_WORKSPACE_RPS": "1000000",
        "BULLPEN_RATE_LIMIT_WORKSPACE_BURST": "1000000",
        "BULLPEN_SSE_MAX_SUBSCRIBERS": str(top + 100),
        "BULLPEN_SSE_MAX_SUBSCRIBERS_PER_WORKSPACE": str(top + 100),
        "BULLPEN_WORKER_CONCURRENCY": str(top + 16),
        "BULLPEN_QUEUE_MAX_BACKLOG": str(top * 2),
        # The provider's per-attempt deadline would cut the long answers short.
        "BULLPEN_PROVIDER_DEADLINE_S": "3600",
    }
    workers = 0
    if backend == "postgres":
        env["BULLPEN_WORKER_ENABLED"] = "false"
        env["BULLPEN_BUS"] = bus
        if bus == "redis":
            env["BULLPEN_REDIS_URL"] = redis_url
        workers = 1
    async with spawn_server(
        backend, pg_admin_url=pg_admin_url, env=env, sim="process", workers=workers
    ) as server:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        measured: list[StreamsLevel] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            agents = await _agents(http, server, top)
            for streams in levels:
                direct = await _direct_level(http, server, streams, hold_s, ramp_timeout_s, on_step)
                level = await _level(http, server, agents, streams, hold_s, ramp_timeout_s, on_step)
                level.direct = direct
                measured.append(level)
                s, d = level.summary(), direct.summary()
                on_step(
                    f"{streams} streams: {s['live']} live, delivery p50 {s['delivery_p50_ms']} "
                    f"ms p99 {s['delivery_p99_ms']} ms (direct {d['delivery_p50_ms']} / "
                    f"{d['delivery_p99_ms']} ms), RSS {s['bullpen_rss_mb']} MB"
                )
    return measured
