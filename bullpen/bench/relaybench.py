"""`bullpen bench --scenario relay`: what the relay adds to a streamed completion.

One simulated provider process and one `bullpen up` process (worker off) whose built-in
`simulated` provider points at it, and a pass-through TCP hop to the simulator in a process of
its own (`bullpen.bench.hop`). The load client (this process) keeps C streams open back to
back, in turn straight to the simulator, through the hop, and through the relay
(`/v1/chat/completions`, model `simulated/sim-1`, authenticated, metered), in rounds of the
same length, so every side sees the same machine at nearly the same time. Per request it
records the time to the first content chunk and to the end of the stream; the relay's
overhead is the difference of the percentiles (relay − direct) at each concurrency, the median
over rounds. The hop's (hop − direct) is the floor under it: what one more process in the
path costs on this machine, before any work of the gateway's.

The load client shares the machine's cores with what it measures, so it does as little as it
can: keep-alive connections over httptools (the gateway's own `Http1Pool`) and, per read, a
search of the bytes for the first non-empty `content` and for `[DONE]`; no line splitting, no
JSON. (With aiohttp reading line by line it used as much CPU as the simulator.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from bullpen.bench.createload import process_cpu_s
from bullpen.bench.report import percentile
from bullpen.bench.spawn import UNLIMITED, SpawnError, free_port, spawn_server, stop_process
from bullpen.gateway.http1 import Http1Pool, Response, Target, target_of

Backend = Literal["sqlite", "postgres"]
MESSAGES = [{"role": "user", "content": "Summarise the quarterly numbers for the team"}]
# A chunk with content: its `content` string is not empty (the opening one's is).
_FIRST_CONTENT = re.compile(rb'"content":"[^"]')
_DONE = b"data: [DONE]"
_TAIL = len(_DONE)  # what a marker split over two reads may have left in the first
STREAM_TIMEOUT_S = 60.0
CONNECT_S = 10.0
# The simulator's pace: a realistic first-token wait would only add noise to a difference.
SIM_ENV = {
    "BULLPEN_SIM_TTFT_MS": "50",
    "BULLPEN_SIM_TOKENS_PER_SECOND": "50",
    "BULLPEN_SIM_RESPONSE_TOKENS": "64",
}
SERVER_ENV = {
    "BULLPEN_WORKER_ENABLED": "false",
    **UNLIMITED,
    # One key drives every stream: its share of the stream slots is the process's whole cap.
    "BULLPEN_RELAY_MAX_STREAMS_PER_WORKSPACE": "2000",
    "BULLPEN_RELAY_MAX_STREAMS_PER_KEY": "2000",
    # --budgets adds a workspace provider over the simulator, on this machine.
    "BULLPEN_OUTBOUND_ALLOW": "127.0.0.1/32",
}
#: How long one stream takes at the simulator's pace.
STREAM_S = int(SIM_ENV["BULLPEN_SIM_TTFT_MS"]) / 1000 + int(
    SIM_ENV["BULLPEN_SIM_RESPONSE_TOKENS"]
) / int(SIM_ENV["BULLPEN_SIM_TOKENS_PER_SECOND"])
SIDES = ("direct", "hop", "relay")
HOP_READY_S = 30.0


@dataclass
class Side:
    """One round's requests to one target."""

    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    errors: int = 0
    warmup_requests: int = 0  # finished during the warm-up: not measured, but served

    def p(self, which: str, q: float) -> float | None:
        """The `q`-th percentile (0-100] of `ttft` or `total`, in ms."""
        return percentile(sorted(getattr(self, f"{which}_ms")), q)


@dataclass
class Level:
    """All rounds at one concurrency."""

    concurrency: int
    direct: list[Side] = field(default_factory=list)
    relay: list[Side] = field(default_factory=list)
    hop: list[Side] = field(default_factory=list)
    budgeted: list[Side] = field(default_factory=list)  # relayed under a budget (--budgets)
    server_cpu_ms_per_request: list[float] = field(default_factory=list)
    hop_cpu_ms_per_request: list[float] = field(default_factory=list)
    budgeted_cpu_ms_per_request: list[float] = field(default_factory=list)

    def added(self, which: str, q: float, side: str = "relay") -> float | None:
        """Median over rounds of (`side` − direct) at the `q`-th percentile (0-100], in ms."""
        diffs = []
        for d, r in zip(self.direct, getattr(self, side), strict=True):
            dp, rp = d.p(which, q), r.p(which, q)
            if dp is not None and rp is not None:
                diffs.append(rp - dp)
        return statistics.median(diffs) if diffs else None

    def summary(self) -> dict[str, Any]:
        """The figures of this level, as JSON."""

        def med(sides: list[Side], which: str, q: float) -> float | None:
            values = [v for s in sides if (v := s.p(which, q)) is not None]
            return round(statistics.median(values), 2) if values else None

        def rounded(value: float | None, digits: int = 2) -> float | None:
            return round(value, digits) if value is not None else None

        out: dict[str, Any] = {"concurrency": self.concurrency}
        for which in ("ttft", "total"):
            for q, name in ((50, "p50"), (99, "p99")):
                out[f"{which}_{name}_direct_ms"] = med(self.direct, which, q)
                out[f"{which}_{name}_relay_ms"] = med(self.relay, which, q)
                out[f"{which}_{name}_added_ms"] = rounded(self.added(which, q))
                if self.hop:
                    out[f"{which}_{name}_hop_ms"] = med(self.hop, which, q)
                    out[f"{which}_{name}_hop_added_ms"] = rounded(self.added(which, q, "hop"))
        out["requests_direct"] = sum(len(s.total_ms) for s in self.direct)
        out["requests_relay"] = sum(len(s.total_ms) for s in self.relay)
        out["requests_hop"] = sum(len(s.total_ms) for s in self.hop)
        out["errors"] = sum(s.errors for s in self.direct + self.relay + self.hop + self.budgeted)
        for key, cpu in (
            ("server_cpu_ms_per_relay_request", self.server_cpu_ms_per_request),
            ("hop_cpu_ms_per_request", self.hop_cpu_ms_per_request),
        ):
            out[key] = rounded(statistics.median(cpu), 3) if cpu else None
        if self.budgeted:
            for which in ("ttft", "total"):
                for q, name in ((50, "p50"), (99, "p99")):
                    out[f"{which}_{name}_budgeted_ms"] = med(self.budgeted, which, q)
            out["requests_budgeted"] = sum(len(s.total_ms) for s in self.budgeted)
            cpu = self.budgeted_cpu_ms_per_request
            out["server_cpu_ms_per_budgeted_request"] = (
                rounded(statistics.median(cpu), 3) if cpu else None
            )
            # Rounds side by side: each round's budgeted CPU over its unbudgeted one.
            ratios = [
                b / r for b, r in zip(cpu, self.server_cpu_ms_per_request, strict=False) if r > 0
            ]
            out["budgeted_cpu_ratio"] = rounded(statistics.median(ratios), 3) if ratios else None
        return out


async def _stream(
    pool: Http1Pool, target: Target, headers: Mapping[str, str], body: bytes, side: Side
) -> None:
    started = time.perf_counter()
    first: float | None = None
    done = False
    tail = b""
    response: Response | None = None
    try:
        async with asyncio.timeout(STREAM_TIMEOUT_S):
            response = await pool.post(target, headers, body, connect_timeout_s=CONNECT_S)
            if response.status != 200:
                side.errors += 1
                response.close()
                return
            while data := await response.read_some():
                seen = tail + data if tail else data
                if first is None and _FIRST_CONTENT.search(seen):
                    first = time.perf_counter()
                if not done and _DONE in seen:
                    done = True
                tail = data[-_TAIL:]
    except (OSError, TimeoutError):
        if response is not None:
            response.close()
        side.errors += 1
        return
    ended = time.perf_counter()
    response.release()
    if not done or first is None:
        side.errors += 1
        return
    side.ttft_ms.append((first - started) * 1000)
    side.total_ms.append((ended - started) * 1000)


async def _round(
    pool: Http1Pool,
    urls: Sequence[str],
    headers: Mapping[str, str],
    body: bytes,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
) -> Side:
    """C clients back to back; requests started after the warm-up and before the end count.
    Client i calls `urls[i % len(urls)]` (several API processes: as a load balancer would).

    The clients' first requests are spread evenly over one stream's length (or the warm-up,
    if shorter): started together, streams of equal length would stay in step, and every
    target would see all C requests arrive within moments of each other once a stream's
    length, rather than C streams open at once.
    """
    measured, scratch = Side(), Side()
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup_s
    stop = start + duration_s
    spread_s = min(STREAM_S, warmup_s)
    targets = [target_of(url) for url in urls]

    async def client(index: int) -> None:
        target = targets[index % len(targets)]
        await asyncio.sleep(spread_s * index / concurrency)
        while True:
            now = loop.time()
            if now >= stop:
                return
            await _stream(pool, target, headers, body, measured if now >= start else scratch)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    measured.warmup_requests = len(scratch.total_ms) + scratch.errors
    return measured


async def _cpu_total_s(pids: Sequence[int]) -> float | None:
    """The CPU seconds of these processes together; None without any (or if one is gone)."""
    total = 0.0
    for pid in pids:
        cpu = await process_cpu_s(pid)
        if cpu is None:
            return None
        total += cpu
    return total if pids else None


async def _budgeted(base_url: str, admin_key: str, sim_url: str) -> tuple[str, str]:
    """Set up the budgets side: a priced provider over the simulator and a key whose calls a
    budget covers (too large to ever refuse one); the model name and the key."""
    auth = {"Authorization": f"Bearer {admin_key}"}
    async with aiohttp.ClientSession(base_url, headers=auth) as http:

        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            async with http.post(path, json=body) as resp:
                if resp.status != 201:
                    raise SpawnError(f"bench setup: POST {path} -> {resp.status}")
                answer: dict[str, Any] = await resp.json()
                return answer

        price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
        await post(
            "/api/v1/providers",
            {"name": "priced", "base_url": sim_url, "models": [{"name": "sim-1", **price}]},
        )
        key = await post("/api/v1/api-keys", {"name": "budgeted"})
        await post(
            "/api/v1/budgets", {"scope": "api_key", "api_key_id": key["id"], "amount_usd": 1e6}
        )
    return "priced/sim-1", str(key["key"])


@contextlib.asynccontextmanager
async def _hop_process(sim_url: str) -> AsyncIterator[tuple[str, int]]:
    """A pass-through hop to the simulator in a process of its own: its base URL and pid."""
    parts = urlsplit(sim_url)
    assert parts.port is not None
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "bullpen.bench.hop", str(port), str(parts.port)),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,  # the bench's own stdout carries its JSON report
    )
    try:
        deadline = time.monotonic() + HOP_READY_S
        while True:
            if proc.returncode is not None:
                raise SpawnError(f"the bench's TCP hop exited with status {proc.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if time.monotonic() > deadline:
                    raise SpawnError(
                        f"the bench's TCP hop did not listen within {HOP_READY_S:g} s"
                    ) from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            break
        yield urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}")), proc.pid
    finally:
        await stop_process(proc)


async def run_relay_bench(
    backend: Backend,
    *,
    pg_admin_url: str,
    concurrencies: Sequence[int] = (50, 200),
    rounds: int = 3,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    api_processes: int = 1,
    budgets: bool = False,
    on_step: Callable[[str], None] = lambda _line: None,
) -> list[Level]:
    """Measure every concurrency level; direct, hop and relay rounds in turn. With
    `api_processes` > 1 (PostgreSQL), the relayed streams are spread over that many API
    processes and their CPU is summed. With `budgets`, relayed calls go to a priced provider
    and a fourth side relays them with a key that a budget covers (metered, reserved and
    settled), so that budgets' cost is measured side by side with the same calls unbudgeted."""
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            spawn_server(
                backend,
                pg_admin_url=pg_admin_url,
                env={**SIM_ENV, **SERVER_ENV},
                sim="process",
                api_processes=api_processes,
            )
        )
        assert server.sim_url is not None
        hop_url, hop_pid = await stack.enter_async_context(_hop_process(server.sim_url))
        body = orjson.dumps({"model": "sim-1", "messages": MESSAGES, "stream": True})
        plain = {"Content-Type": "application/json"}
        model = "simulated/sim-1"
        if budgets:
            model, budgeted_key = await _budgeted(
                server.base_urls[0], server.api_key, server.sim_url
            )
        relayed = orjson.dumps({"model": model, "messages": MESSAGES, "stream": True})
        targets = {
            "direct": ([server.sim_url + "/chat/completions"], plain, body, []),
            "hop": ([hop_url + "/chat/completions"], plain, body, [hop_pid]),
            "relay": (
                [url + "/v1/chat/completions" for url in server.base_urls],
                {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
                relayed,
                server.api_pids,
            ),
        }
        sides: tuple[str, ...] = SIDES
        if budgets:
            targets["budgeted"] = (
                [url + "/v1/chat/completions" for url in server.base_urls],
                {"Content-Type": "application/json", "Authorization": f"Bearer {budgeted_key}"},
                relayed,
                server.api_pids,
            )
            sides = (*SIDES, "budgeted")
        levels = []
        pool = Http1Pool()
        stack.callback(pool.close)
        for concurrency in concurrencies:
            level = Level(concurrency)
            for i in range(rounds):
                # Each side goes first, second, third (and fourth) in turn.
                turn = i % len(sides)
                order = sides[turn:] + sides[:turn]
                for name in order:
                    urls, headers, payload, pids = targets[name]
                    cpu_before = await _cpu_total_s(pids)
                    side = await _round(
                        pool, urls, headers, payload, concurrency, warmup_s, duration_s
                    )
                    cpu_after = await _cpu_total_s(pids)
                    getattr(level, name).append(side)
                    if cpu_before is not None and cpu_after is not None:
                        requests = max(1, len(side.total_ms) + side.warmup_requests)
                        cpu_ms = (cpu_after - cpu_before) * 1000 / requests
                        if name == "relay":
                            level.server_cpu_ms_per_request.append(cpu_ms)
                        elif name == "budgeted":
                            level.budgeted_cpu_ms_per_request.append(cpu_ms)
                        else:
                            level.hop_cpu_ms_per_request.append(cpu_ms)
                    on_step(
                        f"C={concurrency} round {i + 1}/{rounds} {name}: "
                        f"{len(side.total_ms)} streams, ttft p50 "
                        f"{side.p('ttft', 50) or 0:.1f} ms p99 {side.p('ttft', 99) or 0:.1f}"
                        f" ms, errors {side.errors}"
                    )
            levels.append(level)
    return levels
