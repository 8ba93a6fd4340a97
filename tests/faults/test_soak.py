"""SK-1 (TEST-PLAN): a bounded mixed soak, run on demand: `make soak` (10 minutes on
PostgreSQL), or `BULLPEN_SOAK_S=<seconds> uv run pytest tests/faults/test_soak.py`.
Without `BULLPEN_SOAK_S` it is skipped, saying so: it is too long for every CI run.

A real `bullpen up` on PostgreSQL with a worker process beside it, driven by a realistic mix
at once: the reference scenario (create, stream to the end, think), relay calls with about
1 % of them faulted by the simulated provider (a 503 the gateway must survive), and a
workspace event stream that connects and disconnects. Every 10 s the API process's and the
worker's RSS and open file descriptors, the database's connections and the size of every
table are sampled. After a warm-up fifth of the run:
- RSS grows less than `RSS_SLOPE_MB_PER_H` per process (a least-squares line; a starting
  value for a 10-minute run, where allocator noise is a few MB);
- file descriptors and database connections reach a level in the first half of the rest and
  hold it through the second (pools grow to their working set, then stop);
- idempotency keys and sessions stay bounded by their TTL (no table grows without bound
  except those that hold the work itself);
- nothing is lost: every task the load created ends `done`, and no request failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncpg
import pytest

from bullpen.bench.loadgen import run_load
from bullpen.bench.spawn import spawn_server
from bullpen.bench.stages import Stage
from tests.support.postgres import PG_ADMIN_URL

SOAK_S = float(os.environ.get("BULLPEN_SOAK_S", "0"))
RSS_SLOPE_MB_PER_H = 30.0
SAMPLE_S = 10.0
pytestmark = [
    pytest.mark.skipif(SOAK_S <= 0, reason="a soak runs only with BULLPEN_SOAK_S (make soak)"),
    pytest.mark.timeout(int(SOAK_S) + 300),
]


@dataclass
class Samples:
    """Resource readings over time, one list per measure."""

    at: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, at: float, reading: dict[str, float]) -> None:
        self.at.append(at)
        for name, value in reading.items():
            self.values.setdefault(name, []).append(value)

    def slope_per_h(self, name: str, since: float) -> float:
        """Least-squares slope of `name` per hour over the samples taken after `since`."""
        points = [(t, v) for t, v in zip(self.at, self.values[name], strict=True) if t >= since]
        n = len(points)
        mean_t = sum(t for t, _ in points) / n
        mean_v = sum(v for _, v in points) / n
        cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        return cov / var * 3600 if var else 0.0

    def halves(self, name: str, since: float) -> tuple[list[float], list[float]]:
        """The readings of `name` after `since`, in two halves: a pool grows to its working
        set during the first, and must hold there through the second."""
        after = [v for t, v in zip(self.at, self.values[name], strict=True) if t >= since]
        return after[: len(after) // 2], after[len(after) // 2 :]


def _proc(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return {"rss_mb": rss_kb / 1024, "fds": float(len(os.listdir(f"/proc/{pid}/fd")))}


async def _database(conn: asyncpg.Connection, name: str) -> dict[str, float]:
    connections = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
    )
    return {"db_connections": float(connections)}


async def _table_rows(url: str) -> dict[str, float]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT relname, n_live_tup FROM pg_stat_user_tables ORDER BY relname"
        )
        return {f"rows:{r['relname']}": float(r["n_live_tup"]) for r in rows}
    finally:
        await conn.close()


async def _relay_caller(
    base: str, key: str, sim_url: str, stop: asyncio.Event, errors: list[str]
) -> int:
    """Relay calls, one in a hundred to a provider whose simulator answers 503 (the
    simulator's `<model>@<fault>` names; a provider listing no models passes any name on)."""
    calls = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        flaky = {"name": "flaky", "base_url": sim_url, "models": []}
        async with http.post(f"{base}/api/v1/providers", json=flaky) as resp:
            assert resp.status == 201, await resp.text()
        while not stop.is_set():
            calls += 1
            faulted = calls % 100 == 0
            model = "flaky/sim-1@503" if faulted else "simulated/sim-1"
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
                await resp.read()
                if resp.status != (503 if faulted else 200):
                    errors.append(f"relay {model} {resp.status}")
            await asyncio.sleep(0.2)
    return calls


async def _stream_churn(base: str, key: str, stop: asyncio.Event, errors: list[str]) -> int:
    connects = 0
    headers = {"Authorization": f"Bearer {key}"}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=30)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
        while not stop.is_set():
            connects += 1
            async with http.get(f"{base}/api/v1/events") as resp:
                if resp.status != 200:
                    errors.append(f"events {resp.status}")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(2):
                        async for _ in resp.content:
                            pass
    return connects


@pytest.mark.parametrize("backend", ["postgres"])
async def test_a_mixed_soak_keeps_memory_connections_and_tables_flat(backend: str) -> None:
    # The simulator process listens on loopback: the workspace's "flaky" provider may use it.
    env = {"BULLPEN_WORKER_ENABLED": "false", "BULLPEN_OUTBOUND_ALLOW": "127.0.0.1/32"}
    async with spawn_server(backend, pg_admin_url=PG_ADMIN_URL, env=env, workers=1) as server:  # type: ignore[arg-type]
        assert server.database_url is not None and server.sim_url is not None
        sim_url = server.sim_url
        db_name = server.database_url.rsplit("/", 1)[1]
        admin = await asyncpg.connect(PG_ADMIN_URL)
        plain_url = server.database_url.replace("postgresql+asyncpg://", "postgresql://")
        samples = Samples()
        errors: list[str] = []
        stop = asyncio.Event()
        started = time.monotonic()

        async def sample() -> None:
            while not stop.is_set():
                reading: dict[str, float] = {}
                for role, pid in (("api", server.pid), ("worker", server.worker_pids[0])):
                    reading.update({f"{role}_{k}": v for k, v in _proc(pid).items()})
                reading.update(await _database(admin, db_name))
                reading.update(await _table_rows(plain_url))
                samples.add(time.monotonic() - started, reading)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SAMPLE_S)

        sampler = asyncio.create_task(sample())
        side = [
            asyncio.create_task(
                _relay_caller(server.base_url, server.api_key, sim_url, stop, errors)
            ),
            asyncio.create_task(_stream_churn(server.base_url, server.api_key, stop, errors)),
        ]
        stages = [Stage(10, 10, "ramp"), Stage(SOAK_S - 15, 10, "hold"), Stage(5, 0, "down")]
        result = await run_load(server.base_url, server.api_key, server.agent_id, stages)
        stop.set()
        relay_calls, connects = await asyncio.gather(*side)
        await sampler
        await admin.close()

    warm = SOAK_S / 5
    report: dict[str, Any] = {
        "tasks": result.total.completed,
        "relay_calls": relay_calls,
        "stream_connects": connects,
    }
    for role in ("api", "worker"):
        report[f"{role}_rss_slope_mb_per_h"] = round(samples.slope_per_h(f"{role}_rss_mb", warm), 1)
        series = samples.values[f"{role}_rss_mb"]
        report[f"{role}_rss_mb_each_minute"] = [round(v) for v in series[:: int(60 / SAMPLE_S)]]
    print(f"\nSK-1 {backend} {SOAK_S:.0f} s: {report}")
    assert result.total.errors_total == 0, result.error_examples
    assert not errors, errors[:5]
    for role in ("api", "worker"):
        slope = samples.slope_per_h(f"{role}_rss_mb", warm)
        assert slope < RSS_SLOPE_MB_PER_H, f"{role} RSS grows {slope:.1f} MB/h"
        first, second = samples.halves(f"{role}_fds", warm)
        assert max(second) <= max(first) + 2, f"{role} file descriptors grew: {first}, {second}"
    first, second = samples.halves("db_connections", warm)
    assert max(second) <= max(first), f"database connections grew: {first}, {second}"
    for table in ("idempotency_keys", "sessions"):
        if f"rows:{table}" in samples.values:
            first, second = samples.halves(f"rows:{table}", warm)
            assert max(second) <= max(first) * 2 + 100, f"{table} grows: {first}, {second}"
