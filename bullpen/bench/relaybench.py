"""`bullpen bench --scenario relay`: what the relay adds to a streamed completion.

One simulated provider process and one `bullpen up` process (worker off) whose built-in
`simulated` provider points at it. The load client (this process) keeps C streams open back
to back, alternately straight to the simulator and through the relay (`/v1/chat/completions`,
model `simulated/sim-1`, authenticated, metered), in rounds of the same length, so both sides
see the same machine at nearly the same time. Per request it records the time to the first
content chunk and to the end of the stream; the relay's overhead is the difference of the
percentiles (relay − direct) at each concurrency, the median over rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from bullpen.bench.createload import _cpu_s
from bullpen.bench.report import percentile
from bullpen.bench.spawn import UNLIMITED, spawn_server

Backend = Literal["sqlite", "postgres"]
MESSAGES = [{"role": "user", "content": "Summarise the quarterly numbers for the team"}]
_CONTENT = b'"content":"'
_EMPTY = b'"content":""'
_DONE = b"data: [DONE]"
# The simulator's pace: a realistic first-token wait would only add noise to a difference.
SIM_ENV = {
    "BULLPEN_SIM_TTFT_MS": "50",
    "BULLPEN_SIM_TOKENS_PER_SECOND": "50",
    "BULLPEN_SIM_RESPONSE_TOKENS": "64",
}
SERVER_ENV = {"BULLPEN_WORKER_ENABLED": "false", **UNLIMITED}


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
    server_cpu_ms_per_request: list[float] = field(default_factory=list)

    def added(self, which: str, q: float) -> float | None:
        """Median over rounds of (relay − direct) at the `q`-th percentile (0-100], in ms."""
        diffs = []
        for d, r in zip(self.direct, self.relay, strict=True):
            dp, rp = d.p(which, q), r.p(which, q)
            if dp is not None and rp is not None:
                diffs.append(rp - dp)
        return statistics.median(diffs) if diffs else None

    def summary(self) -> dict[str, Any]:
        """The figures of this level, as JSON."""

        def med(sides: list[Side], which: str, q: float) -> float | None:
            values = [v for s in sides if (v := s.p(which, q)) is not None]
            return round(statistics.median(values), 2) if values else None

        out: dict[str, Any] = {"concurrency": self.concurrency}
        for which in ("ttft", "total"):
            for q, name in ((50, "p50"), (99, "p99")):
                added = self.added(which, q)
                out[f"{which}_{name}_direct_ms"] = med(self.direct, which, q)
                out[f"{which}_{name}_relay_ms"] = med(self.relay, which, q)
                out[f"{which}_{name}_added_ms"] = round(added, 2) if added is not None else None
        out["requests_direct"] = sum(len(s.total_ms) for s in self.direct)
        out["requests_relay"] = sum(len(s.total_ms) for s in self.relay)
        out["errors"] = sum(s.errors for s in self.direct + self.relay)
        cpu = self.server_cpu_ms_per_request
        out["server_cpu_ms_per_relay_request"] = round(statistics.median(cpu), 3) if cpu else None
        return out


async def _stream(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes, side: Side
) -> None:
    started = time.perf_counter()
    first: float | None = None
    try:
        async with http.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                side.errors += 1
                await resp.read()
                return
            done = False
            async for line in resp.content:
                if first is None and _CONTENT in line and _EMPTY not in line:
                    first = time.perf_counter()
                if line.startswith(_DONE):
                    done = True
            if not done or first is None:
                side.errors += 1
                return
    except (aiohttp.ClientError, TimeoutError):
        side.errors += 1
        return
    ended = time.perf_counter()
    side.ttft_ms.append((first - started) * 1000)
    side.total_ms.append((ended - started) * 1000)


async def _round(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    body: bytes,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
) -> Side:
    """C clients back to back; requests started after the warm-up and before the end count."""
    measured, scratch = Side(), Side()
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup_s
    stop = start + duration_s

    async def client() -> None:
        while True:
            now = loop.time()
            if now >= stop:
                return
            await _stream(http, url, headers, body, measured if now >= start else scratch)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    measured.warmup_requests = len(scratch.total_ms) + scratch.errors
    return measured


async def run_relay_bench(
    backend: Backend,
    *,
    pg_admin_url: str,
    concurrencies: Sequence[int] = (50, 200),
    rounds: int = 3,
    duration_s: float = 10.0,
    warmup_s: float = 2.0,
    on_step: Callable[[str], None] = lambda _line: None,
) -> list[Level]:
    """Measure every concurrency level; alternate direct and relay rounds."""
    async with spawn_server(
        backend, pg_admin_url=pg_admin_url, env={**SIM_ENV, **SERVER_ENV}, sim="process"
    ) as server:
        assert server.sim_url is not None
        direct = (
            server.sim_url + "/chat/completions",
            {"Content-Type": "application/json"},
            orjson.dumps({"model": "sim-1", "messages": MESSAGES, "stream": True}),
        )
        relay = (
            server.base_url + "/v1/chat/completions",
            {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
            orjson.dumps({"model": "simulated/sim-1", "messages": MESSAGES, "stream": True}),
        )
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        timeout = aiohttp.ClientTimeout(total=60)
        levels = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            for concurrency in concurrencies:
                level = Level(concurrency)
                for i in range(rounds):
                    order = ("direct", "relay") if i % 2 == 0 else ("relay", "direct")
                    for name in order:
                        url, headers, body = direct if name == "direct" else relay
                        cpu_before = await _cpu_s(server.pid)
                        side = await _round(
                            http, url, headers, body, concurrency, warmup_s, duration_s
                        )
                        cpu_after = await _cpu_s(server.pid)
                        getattr(level, name).append(side)
                        if name == "relay" and cpu_before is not None and cpu_after is not None:
                            requests = max(1, len(side.total_ms) + side.warmup_requests)
                            level.server_cpu_ms_per_request.append(
                                (cpu_after - cpu_before) * 1000 / requests
                            )
                        on_step(
                            f"C={concurrency} round {i + 1}/{rounds} {name}: "
                            f"{len(side.total_ms)} streams, ttft p50 "
                            f"{side.p('ttft', 50) or 0:.1f} ms p99 {side.p('ttft', 99) or 0:.1f}"
                            f" ms, errors {side.errors}"
                        )
                levels.append(level)
    return levels
