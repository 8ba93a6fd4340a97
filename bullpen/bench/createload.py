"""The create-task scenario: closed-loop `POST /api/v1/tasks` throughput and latency.

`N` clients each create tasks back to back (`Authorization: Bearer`, a fresh
`Idempotency-Key: <uuid4>` per request unless `keyed` is off) for a warm-up and then a
measured window. A create
counts when its 201 arrives inside the window; latency is taken from those. Requests still in
flight when the window closes are awaited (never cancelled, so no task is created unseen) and
land in `created_total` with the warm-up's: the number of tasks the server stored. Errors are
counted by kind over the whole round (see `ERROR_KINDS`); a client pauses briefly after one so a
failing server is not hammered in a tight loop.

The server runs with its worker off (`BULLPEN_WORKER_ENABLED=false`), no simulator, and rate
limits (and the queue's backlog bound) raised so high that they are on the path but never
answer 429 (`SERVER_ENV`): only the create path is measured.

`run_create_bench` compares servers on one machine: the checkout's code, with a baseline
revision that revision's code (same interpreter, same backend kind, each with its own fresh
database), and the floor: a bare endpoint on the same framework and driver doing one insert per
request (`bullpen.bench.floor`, its own process and database). Rounds alternate current,
baseline, floor, current… with one server under load at a time, so drift of the machine hits
all; medians over the rounds and the ratios current / baseline and current / floor summarise.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from rich.table import Table

from bullpen.bench.loadgen import make_prompt
from bullpen.bench.report import (
    Distribution,
    load_1m,
    median_of,
    ratio,
    round_or_none,
    rounded,
)
from bullpen.bench.spawn import (
    UNLIMITED,
    Backend,
    SourceTree,
    SpawnedServer,
    SpawnError,
    extract_revision,
    head_commit,
    spawn_floor,
    spawn_server,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_DURATION_S",
    "DEFAULT_ROUNDS",
    "DEFAULT_WARMUP_S",
    "ERROR_KINDS",
    "FLOOR_GOAL_PCT",
    "SERVER_ENV",
    "THROUGHPUT_COST_GOAL_PCT",
    "CreateComparison",
    "CreateRound",
    "ServerInfo",
    "render_create_table",
    "run_create_bench",
    "run_create_load",
]

JSON_VERSION = 1
DEFAULT_CONCURRENCY = 32
DEFAULT_DURATION_S = 15.0
DEFAULT_WARMUP_S = 3.0
DEFAULT_ROUNDS = 3
#: The full contract may cost at most this share of the skeleton's create throughput.
THROUGHPUT_COST_GOAL_PCT = 25.0
#: Bullpen's creates/s must be at least this share of the floor's (issue 21).
FLOOR_GOAL_PCT = 50.0

#: Environment of every server this scenario starts (older revisions ignore unknown names).
SERVER_ENV = {
    "BULLPEN_WORKER_ENABLED": "false",
    **UNLIMITED,
    # No worker runs, so the queue only grows: keep the backlog bound out of the measurement.
    "BULLPEN_QUEUE_MAX_BACKLOG": "1000000000",
}

#: Error kinds; `http_<status>` carries the status of an answer other than 201.
ERROR_KINDS = {
    "http_<status>": "POST /api/v1/tasks answered something other than 201",
    "connection": "connecting or sending failed",
    "timeout": "no answer within the request timeout",
    "client_error": "another HTTP client error",
    "bad_response": "a 201 whose body has no task id",
    "unexpected": "a bug in the client (the example shows the exception)",
}

_ERROR_PAUSE_S = 0.05
_RETRY_AFTER_CAP_S = 1.0
_EXAMPLE_CHARS = 300
_DASH = "–"


@dataclass(frozen=True)
class CreateRound:
    """One measured round against one server."""

    server: str
    index: int
    concurrency: int
    warmup_s: float
    duration_s: float
    created: int
    created_total: int
    duplicate_ids: int
    latency_ms: Distribution
    errors: dict[str, int]
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float | None = None
    error_examples: dict[str, str] = field(default_factory=dict)

    @property
    def created_per_s(self) -> float | None:
        """Creates answered 201 per second of the measured window."""
        return self.created / self.duration_s if self.duration_s > 0 else None

    @property
    def errors_total(self) -> int:
        """Every error of the round, whatever its kind."""
        return sum(self.errors.values())

    @property
    def server_cpu_ms_per_create(self) -> float | None:
        """Server process CPU per create in the window (PostgreSQL's own CPU not included)."""
        if self.server_cpu_s is None or self.created == 0:
            return None
        return 1000.0 * self.server_cpu_s / self.created

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form (milliseconds)."""
        return {
            "round": self.index,
            "server": self.server,
            "concurrency": self.concurrency,
            "warmup_s": round_or_none(self.warmup_s),
            "duration_s": round_or_none(self.duration_s),
            "created": self.created,
            "created_per_s": round_or_none(self.created_per_s),
            "created_total": self.created_total,
            "duplicate_ids": self.duplicate_ids,
            "latency_ms": self.latency_ms.as_dict(),
            "errors": self.errors,
            "errors_total": self.errors_total,
            "error_examples": self.error_examples,
            "wall_s": round_or_none(self.wall_s),
            "client_cpu_pct": round_or_none(100 * self.client_cpu_s / self.wall_s)
            if self.wall_s > 0
            else None,
            "server_cpu_ms_per_create": round_or_none(self.server_cpu_ms_per_create),
        }


class _CreateLoad:
    """State shared by the clients of one round."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        agent_id: str,
        *,
        measure_from: float,
        until: float,
        request_timeout_s: float,
        keyed: bool,
    ) -> None:
        self.session = session
        self.keyed = keyed
        self.url = f"{base_url}/api/v1/tasks"
        self.agent_id = agent_id
        self.measure_from = measure_from
        self.until = until
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, sock_connect=min(10.0, request_timeout_s)
        )
        self.latencies: list[float] = []
        self.created = 0
        self.ids: set[str] = set()
        self.created_total = 0
        self.errors: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self._prompts = itertools.count()

    def fail(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        self.examples.setdefault(kind, detail[:_EXAMPLE_CHARS])

    async def client(self) -> None:
        """Create tasks back to back until the window closes; never raise."""
        while time.perf_counter() < self.until:
            try:
                pause = await self.create()
            except Exception as exc:  # a client bug must not silently shrink the load
                self.fail("unexpected", repr(exc))
                pause = _ERROR_PAUSE_S
            if pause > 0:
                await asyncio.sleep(min(pause, max(0.0, self.until - time.perf_counter())))

    async def create(self) -> float:
        """Send one create; return how long to pause before the next (0 after a 201)."""
        body = orjson.dumps({"prompt": make_prompt(next(self._prompts)), "agent_id": self.agent_id})
        headers = {"Content-Type": "application/json"}
        if self.keyed:
            headers["Idempotency-Key"] = str(uuid.uuid4())
        sent = time.perf_counter()
        try:
            async with self.session.post(
                self.url, data=body, headers=headers, timeout=self.timeout
            ) as resp:
                raw = await resp.read()
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
        except (TimeoutError, aiohttp.ClientError) as exc:
            # aiohttp's timeouts are also connection errors: check them first.
            kind = "timeout" if isinstance(exc, TimeoutError) else "client_error"
            if kind != "timeout" and isinstance(exc, aiohttp.ClientConnectionError):
                kind = "connection"
            self.fail(kind, repr(exc))
            return _ERROR_PAUSE_S
        answered = time.perf_counter()
        if status != 201:
            self.fail(f"http_{status}", raw.decode(errors="replace"))
            return max(_ERROR_PAUSE_S, _retry_after(retry_after))
        # Count before parsing: the server stored the task whatever its body looks like.
        self.created_total += 1
        if self.measure_from <= answered < self.until:
            self.created += 1
            self.latencies.append(answered - sent)
        try:
            task_id = orjson.loads(raw)["id"]
            if not isinstance(task_id, str):
                raise TypeError(f"id is {type(task_id).__name__}")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.fail("bad_response", f"{exc!r}: {raw[:200]!r}")
            return _ERROR_PAUSE_S
        self.ids.add(task_id)
        return 0.0


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), _RETRY_AFTER_CAP_S) if math.isfinite(seconds) else 0.0


def read_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may contain spaces.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def process_cpu_s(pid: int | None) -> float | None:
    return None if pid is None else await asyncio.to_thread(read_cpu_s, pid)


async def run_create_load(
    base_url: str,
    api_key: str,
    agent_id: str,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    duration_s: float = DEFAULT_DURATION_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    request_timeout_s: float = 30.0,
    server: str = "current",
    index: int = 1,
    server_pid: int | None = None,
    keyed: bool = True,
) -> CreateRound:
    """Run one round of the create scenario against `base_url` and return its figures.

    With `server_pid` (a local server) the server process's CPU over the window is sampled.
    `keyed`: each create carries a fresh `Idempotency-Key`.
    """
    if concurrency < 1 or not duration_s > 0 or not warmup_s >= 0 or not request_timeout_s > 0:
        raise ValueError("concurrency >= 1, duration_s > 0, warmup_s >= 0 and a timeout > 0")
    base_url = base_url.rstrip("/")
    connector = aiohttp.TCPConnector(
        limit=concurrency + 4, limit_per_host=0, keepalive_timeout=30.0, ttl_dns_cache=300
    )
    cpu_start = time.process_time()
    start = time.perf_counter()
    async with aiohttp.ClientSession(
        connector=connector, headers={"Authorization": f"Bearer {api_key}"}
    ) as session:
        load = _CreateLoad(
            session,
            base_url,
            agent_id,
            measure_from=start + warmup_s,
            until=start + warmup_s + duration_s,
            request_timeout_s=request_timeout_s,
            keyed=keyed,
        )
        clients = [asyncio.create_task(load.client()) for _ in range(concurrency)]
        try:
            await asyncio.sleep(max(0.0, load.measure_from - time.perf_counter()))
            server_cpu_from = await process_cpu_s(server_pid)
            await asyncio.sleep(max(0.0, load.until - time.perf_counter()))
            server_cpu_until = await process_cpu_s(server_pid)
            # The clients stop on their own once their request in flight is answered.
            await asyncio.gather(*clients)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
    wall_s = time.perf_counter() - start
    server_cpu_s = (
        server_cpu_until - server_cpu_from
        if server_cpu_from is not None and server_cpu_until is not None
        else None
    )
    return CreateRound(
        server=server,
        index=index,
        concurrency=concurrency,
        warmup_s=warmup_s,
        duration_s=duration_s,
        created=load.created,
        created_total=load.created_total,
        duplicate_ids=load.created_total - len(load.ids) - load.errors["bad_response"],
        latency_ms=Distribution.of_seconds(load.latencies),
        errors=dict(sorted(load.errors.items())),
        wall_s=wall_s,
        client_cpu_s=time.process_time() - cpu_start,
        server_cpu_s=server_cpu_s,
        error_examples=dict(sorted(load.examples.items())),
    )


@dataclass(frozen=True)
class ServerInfo:
    """Which code a measured server ran: `current` (this checkout) or `baseline` (a revision)."""

    name: str
    ref: str
    commit: str | None

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"name": self.name, "ref": self.ref, "commit": self.commit}


@dataclass(frozen=True)
class CreateComparison:
    """Every round of a create bench, with medians per server and ratios current / baseline."""

    backend: str
    concurrency: int
    duration_s: float
    warmup_s: float
    rounds: int
    servers: list[ServerInfo]
    results: list[CreateRound]
    #: 1-minute load average before the first round and after the last (our load included):
    #: other work on the machine shows up here and makes the figures less comparable.
    load_before: float | None = None
    load_after: float | None = None
    #: Whether each create carried an `Idempotency-Key` (the default: what a careful client
    #: sends, and one more statement in the create's transaction).
    keyed: bool = True

    def median(self, server: str) -> dict[str, Any]:
        """Median creates/s, p50, p99 and server CPU per create over `server`'s rounds."""
        mine = [r for r in self.results if r.server == server]
        return {
            "created_per_s": median_of([r.created_per_s for r in mine]),
            "p50_ms": median_of([r.latency_ms.p50 for r in mine]),
            "p99_ms": median_of([r.latency_ms.p99 for r in mine]),
            "server_cpu_ms_per_create": median_of([r.server_cpu_ms_per_create for r in mine]),
            "errors_total": sum(r.errors_total for r in mine),
        }

    def ratio(self) -> dict[str, float | None] | None:
        """Current / baseline of each median (None without a baseline)."""
        if not any(s.name == "baseline" for s in self.servers):
            return None
        current, baseline = self.median("current"), self.median("baseline")
        keys = ("created_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_create")
        return {k: ratio(current[k], baseline[k]) for k in keys}

    def floor_ratio(self) -> dict[str, float | None] | None:
        """Current / floor of each median (None without a floor)."""
        if not any(s.name == "floor" for s in self.servers):
            return None
        current, floor = self.median("current"), self.median("floor")
        keys = ("created_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_create")
        return {k: ratio(current[k], floor[k]) for k in keys}

    def pct_of_floor(self) -> float | None:
        """The current code's median creates/s as a share of the floor's, in %."""
        ratio = self.floor_ratio()
        if ratio is None or ratio["created_per_s"] is None:
            return None
        return 100.0 * ratio["created_per_s"]

    def throughput_cost_pct(self) -> float | None:
        """How much create throughput the current code gives up against the baseline, in %."""
        ratio = self.ratio()
        if ratio is None or ratio["created_per_s"] is None:
            return None
        return 100.0 * (1.0 - ratio["created_per_s"])

    @property
    def errors_total(self) -> int:
        """Every error of every round."""
        return sum(r.errors_total for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        """Return the one JSON object `bullpen bench --scenario create --json` prints."""
        ratio = self.ratio()
        cost = self.throughput_cost_pct()
        floor_ratio = self.floor_ratio()
        of_floor = self.pct_of_floor()
        return {
            "version": JSON_VERSION,
            "scenario": "create",
            "backend": self.backend,
            "concurrency": self.concurrency,
            "idempotency_key": self.keyed,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "rounds": self.rounds,
            "server_env": SERVER_ENV,
            "servers": [s.as_dict() for s in self.servers],
            "results": [r.as_dict() for r in self.results],
            "median": {s.name: rounded(self.median(s.name)) for s in self.servers},
            "ratio": None if ratio is None else rounded(ratio),
            "throughput_cost_pct": round_or_none(cost),
            "goal": {
                "max_throughput_cost_pct": THROUGHPUT_COST_GOAL_PCT,
                "met": None if cost is None else cost <= THROUGHPUT_COST_GOAL_PCT,
            },
            "floor_ratio": None if floor_ratio is None else rounded(floor_ratio),
            "floor_goal": {
                "min_pct_of_floor": FLOOR_GOAL_PCT,
                "pct_of_floor": round_or_none(of_floor),
                "met": None if of_floor is None else of_floor >= FLOOR_GOAL_PCT,
            },
            "errors_total": self.errors_total,
            "machine": {
                "cpus": os.cpu_count(),
                "load_1m_before": round_or_none(self.load_before, 2),
                "load_1m_after": round_or_none(self.load_after, 2),
            },
        }


async def run_create_bench(
    backend: Backend,
    *,
    baseline_ref: str | None = None,
    pg_admin_url: str = "postgresql://postgres@127.0.0.1:5432/test",
    concurrency: int = DEFAULT_CONCURRENCY,
    duration_s: float = DEFAULT_DURATION_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    rounds: int = DEFAULT_ROUNDS,
    floor: bool = True,
    keyed: bool = True,
    on_round: Callable[[CreateRound], None] | None = None,
) -> CreateComparison:
    """Start the server(s), run the rounds alternately and return every figure.

    The load generator is always this checkout's; only the servers differ. With `floor` the
    bare endpoint (`bullpen.bench.floor`) takes its turn after the servers in every round.
    """
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    async with contextlib.AsyncExitStack() as stack:
        # A bad revision should fail before any server is started.
        tree = None
        if baseline_ref is not None:
            tree = await stack.enter_async_context(extract_revision(baseline_ref))
        commit: str | None = None
        with contextlib.suppress(SpawnError):  # not a git checkout: measure all the same
            commit = await head_commit()
        infos = [ServerInfo("current", "working tree", commit)]
        sources: list[SourceTree | None] = [None]
        if tree is not None:
            infos.append(ServerInfo("baseline", tree.ref, tree.commit))
            sources.append(tree)
        starting: list[Any] = [
            spawn_server(backend, pg_admin_url=pg_admin_url, env=SERVER_ENV, sim="none", source=src)
            for src in sources
        ]
        if floor:
            infos.append(ServerInfo("floor", "bare endpoint, bullpen.bench.floor", commit))
            starting.append(spawn_floor(backend, pg_admin_url=pg_admin_url))
        # Start them all at once (imports and `init` take seconds); none is under load yet.
        started = await asyncio.gather(
            *(stack.enter_async_context(cm) for cm in starting), return_exceptions=True
        )
        servers: list[tuple[ServerInfo, _Target]] = []
        for info, item in zip(infos, started, strict=True):
            if isinstance(item, BaseException):
                raise item  # the stack stops whichever server did start
            if isinstance(item, SpawnedServer):
                target = _Target(item.base_url, item.api_key, item.agent_id, item.pid)
            else:  # the floor takes any bearer token and stores any agent id
                target = _Target(item.base_url, uuid.uuid4().hex, str(uuid.uuid4()), item.pid)
            servers.append((info, target))
        results: list[CreateRound] = []
        load_before = load_1m()
        for index in range(1, rounds + 1):
            for info, target in servers:  # one server under load at a time
                result = await run_create_load(
                    target.base_url,
                    target.api_key,
                    target.agent_id,
                    concurrency=concurrency,
                    duration_s=duration_s,
                    warmup_s=warmup_s,
                    server=info.name,
                    index=index,
                    server_pid=target.pid,
                    keyed=keyed,
                )
                results.append(result)
                if on_round is not None:
                    on_round(result)
        return CreateComparison(
            backend=backend,
            concurrency=concurrency,
            duration_s=duration_s,
            warmup_s=warmup_s,
            rounds=rounds,
            servers=[info for info, _ in servers],
            results=results,
            load_before=load_before,
            load_after=load_1m(),
            keyed=keyed,
        )


@dataclass(frozen=True)
class _Target:
    """Where one measured server listens, the credentials it takes and its pid."""

    base_url: str
    api_key: str = field(repr=False)
    agent_id: str
    pid: int


def render_create_table(comparison: CreateComparison) -> Table:
    """Return the per-round table with each server's medians and the ratios."""
    c = comparison
    table = Table(
        title=(
            f"bullpen bench create — {c.backend}, {c.concurrency} clients, "
            f"{'an' if c.keyed else 'no'} Idempotency-Key per create, "
            f"{c.duration_s:g} s per round after {c.warmup_s:g} s warm-up"
        ),
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("round", overflow="fold")
    table.add_column("server", overflow="fold")
    for name in ("creates/s", "p50 ms", "p99 ms", "server CPU\nms/create", "client\nCPU %"):
        table.add_column(name, justify="right", overflow="fold")
    table.add_column("errors", justify="right", overflow="fold")
    for r in c.results:
        client = 100 * r.client_cpu_s / r.wall_s if r.wall_s > 0 else None
        d = r.latency_ms
        cells = _cells(r.created_per_s, d.p50, d.p99, r.server_cpu_ms_per_create, client)
        table.add_row(str(r.index), r.server, *cells, str(r.errors_total))
    table.add_section()
    for s in c.servers:
        m = c.median(s.name)
        cells = _cells(
            m["created_per_s"], m["p50_ms"], m["p99_ms"], m["server_cpu_ms_per_create"], None
        )
        table.add_row("median", s.name, *cells[:-1], "", str(m["errors_total"]), style="bold")
    ratio = c.ratio()
    if ratio is not None:
        table.add_section()
        cells = [_fmt(ratio[k], 2) for k in ("created_per_s", "p50_ms", "p99_ms")]
        cells.append(_fmt(ratio["server_cpu_ms_per_create"], 2))
        table.add_row("ratio", "current / baseline", *cells, "", "", style="bold")
    floor_ratio = c.floor_ratio()
    if floor_ratio is not None:
        if ratio is None:
            table.add_section()
        cells = [_fmt(floor_ratio[k], 2) for k in ("created_per_s", "p50_ms", "p99_ms")]
        cells.append(_fmt(floor_ratio["server_cpu_ms_per_create"], 2))
        table.add_row("ratio", "current / floor", *cells, "", "", style="bold")
    lines = ["; ".join(f"{s.name} = {s.ref} ({(s.commit or '?')[:12]})" for s in c.servers)]
    if c.load_before is not None and c.load_after is not None:
        lines.append(
            f"load average {c.load_before:.2f} before, {c.load_after:.2f} after "
            f"({os.cpu_count()} CPUs)"
        )
    cost = c.throughput_cost_pct()
    if cost is not None:
        verdict = "met" if cost <= THROUGHPUT_COST_GOAL_PCT else "NOT met"
        goal = f"goal ≤ {THROUGHPUT_COST_GOAL_PCT:g} %: {verdict}"
        lines.append(f"throughput cost {cost:.1f} % ({goal})")
    of_floor = c.pct_of_floor()
    if of_floor is not None:
        verdict = "met" if of_floor >= FLOOR_GOAL_PCT else "NOT met"
        lines.append(
            f"creates/s {of_floor:.0f} % of the floor's (goal ≥ {FLOOR_GOAL_PCT:g} %: {verdict})"
        )
    errors: Counter[str] = sum((Counter(r.errors) for r in c.results), Counter())
    if errors:
        lines.append("errors: " + ", ".join(f"{k}={n}" for k, n in sorted(errors.items())))
    table.caption = "\n".join(lines)
    return table


def _cells(
    rate: float | None,
    p50: float | None,
    p99: float | None,
    server_cpu: float | None,
    client_cpu: float | None,
) -> list[str]:
    return [_fmt(rate, 0), _fmt(p50), _fmt(p99), _fmt(server_cpu, 2), _fmt(client_cpu, 0)]


def _fmt(value: float | None, digits: int = 1) -> str:
    return _DASH if value is None else f"{value:.{digits}f}"
