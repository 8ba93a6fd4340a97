"""LO-1 (TEST-PLAN): three times the capacity offered, then recovery.

A real `bullpen up` with a small worker (8 runs at once) and a queue bound of 60 per
workspace. Its capacity C (runs finished per second, saturated) is measured first; then
tasks are offered open-loop at 3·C for 10 s. What must hold:
- every answer is 201, or 429/503 problem+json with a `Retry-After`: nothing else;
- the queue never holds more than its bound, so an accepted task's wait is bounded by
  about bound / C (checked with a wide margin: the machine is shared);
- every accepted task ends `done`: nothing accepted is lost;
- once the offer stops, the server is back: a new task's queue wait is near the idle one.
How fast refusals come is printed for the record, not asserted (`bullpen bench` measures).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from bullpen.bench.spawn import spawn_server
from tests.support.postgres import PG_ADMIN_URL

pytestmark = pytest.mark.timeout(240)
BOUND = 60
PROMPT = "Analyze this dataset and extract key metrics"
ENV = {
    "BULLPEN_WORKER_CONCURRENCY": "8",
    "BULLPEN_WORKER_RESERVED_SLOTS": "0",
    "BULLPEN_SIM_TTFT_MS": "100",
    "BULLPEN_SIM_TOKENS_PER_SECOND": "200",
    "BULLPEN_SIM_RESPONSE_TOKENS": "16",
    "BULLPEN_QUEUE_MAX_BACKLOG": str(BOUND),
    "BULLPEN_QUEUE_BACKLOG_RETRY_AFTER_S": "1",
    # The queue's bound, not the request rate limiter, is what sheds load here.
    "BULLPEN_RATE_LIMIT_KEY_RPS": "100000",
    "BULLPEN_RATE_LIMIT_KEY_BURST": "100000",
    "BULLPEN_RATE_LIMIT_WORKSPACE_RPS": "100000",
    "BULLPEN_RATE_LIMIT_WORKSPACE_BURST": "100000",
}


class Client:
    """Creates tasks and reads them back, recording every answer."""

    def __init__(self, http: aiohttp.ClientSession, base_url: str, agent_id: str) -> None:
        self.http = http
        self.base = base_url
        self.agent_id = agent_id
        self.accepted: list[str] = []
        self.refused: list[tuple[int, float]] = []  # (status, seconds to answer)
        self.bad: list[str] = []

    async def create(self) -> str | None:
        started = time.monotonic()
        async with self.http.post(
            f"{self.base}/api/v1/tasks", json={"prompt": PROMPT, "agent_id": self.agent_id}
        ) as resp:
            body = await resp.text()
            took = time.monotonic() - started
            if resp.status == 201:
                task_id: str = (await resp.json())["id"]
                self.accepted.append(task_id)
                return task_id
            problem = resp.headers.get("Content-Type") == "application/problem+json"
            if resp.status in (429, 503) and problem and resp.headers.get("Retry-After"):
                self.refused.append((resp.status, took))
            else:
                self.bad.append(f"{resp.status} {dict(resp.headers)} {body[:300]}")
            return None

    async def task(self, task_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.base}/api/v1/tasks/{task_id}") as resp:
            assert resp.status == 200
            found: dict[str, Any] = await resp.json()
            return found

    async def queued(self) -> int:
        async with self.http.get(
            f"{self.base}/api/v1/tasks", params={"status": "queued", "limit": "100"}
        ) as resp:
            assert resp.status == 200
            return len((await resp.json())["items"])

    async def until_done(self, task_ids: list[str], seconds: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + seconds
        pending = list(task_ids)
        done: list[dict[str, Any]] = []
        while pending:
            task = await self.task(pending[0])
            if task["status"] in ("done", "failed", "cancelled"):
                done.append(task)
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                pytest.fail(f"{len(pending)} accepted tasks did not end within {seconds} s")
            await asyncio.sleep(0.2)
        return done


def _wait_s(task: dict[str, Any]) -> float:
    run = task["run"]
    started = datetime.fromisoformat(run["started_at"])
    return (started - datetime.fromisoformat(run["queued_at"])).total_seconds()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_three_times_capacity_is_shed_fast_and_the_server_recovers(backend: str) -> None:
    async with spawn_server(backend, pg_admin_url=PG_ADMIN_URL, env=ENV) as server:  # type: ignore[arg-type]
        headers = {"Authorization": f"Bearer {server.api_key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            client = Client(http, server.base_url, server.agent_id)
            idle_id = await client.create()
            assert idle_id is not None
            (idle,) = await client.until_done([idle_id], 30)
            idle_wait = _wait_s(idle)

            # Capacity: the time a full queue takes to drain.
            started = time.monotonic()
            burst = [await client.create() for _ in range(BOUND)]
            await client.until_done([t for t in burst if t], 60)
            capacity = BOUND / (time.monotonic() - started)

            rate = 3 * capacity
            offered = 0
            depth: list[int] = []
            creates: list[asyncio.Task[str | None]] = []
            first = len(client.accepted)
            ends = time.monotonic() + 10
            next_at = time.monotonic()
            while time.monotonic() < ends:
                creates.append(asyncio.create_task(client.create()))
                offered += 1
                if offered % 20 == 0:
                    depth.append(await client.queued())
                next_at += 1 / rate
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await asyncio.gather(*creates)
            under_load = client.accepted[first:]
            finished = await client.until_done(under_load, 120)

            after_id = await client.create()
            assert after_id is not None
            (after,) = await client.until_done([after_id], 60)

    waits = sorted(_wait_s(t) for t in finished)
    refusal_s = sorted(took for _, took in client.refused)
    print(
        f"\nLO-1 {backend}: capacity {capacity:.1f} runs/s, offered {offered} at "
        f"{rate:.0f}/s, accepted {len(under_load)}, refused {len(client.refused)} "
        f"(p50 {statistics.median(refusal_s) * 1000:.0f} ms, "
        f"max {refusal_s[-1] * 1000:.0f} ms), queue depth max {max(depth)}, "
        f"accepted wait p50 {statistics.median(waits):.2f} s max {waits[-1]:.2f} s, "
        f"idle wait {idle_wait * 1000:.0f} ms, after {_wait_s(after) * 1000:.0f} ms"
    )
    assert not client.bad, client.bad[:5]
    assert client.refused, "3x capacity was never refused: the bound did not act"
    assert max(depth) <= BOUND
    assert all(t["status"] == "done" for t in finished), [
        t["run"]["error"] for t in finished if t["status"] != "done"
    ]
    # A full queue drains in about BOUND / capacity; anything waiting far longer was starved.
    assert waits[-1] <= 6 * BOUND / capacity + 5, waits[-5:]
    assert _wait_s(after) <= 2 * idle_wait + 1.0, "the server did not recover"
