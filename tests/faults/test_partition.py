"""FC-3: the network between workers and PostgreSQL fails (TEST-PLAN): a partition in which
TCP has not noticed (half-open connections, nothing flows, new connects hang), then every
connection reset. Two workers reach the database through a fault-injecting proxy, a third
directly; the ledger afterwards shows nothing lost, duplicated or unexpected, the partitioned
workers' runs were taken over once their leases lapsed, and the partitioned workers are still
running and working once the network heals, without anyone restarting them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from bullpen.settings import Settings
from tests.support.cluster import bootstrap, enqueue, ledger, open_store, wait_terminal, worker_env
from tests.support.cluster import workers as worker_pool
from tests.support.proxy import FaultProxy, Mode

pytestmark = [pytest.mark.timeout(300), pytest.mark.parametrize("backend", ["postgres"])]
LEASE_S = 2.0
TASKS = 600


def _through(url: str, port: int) -> str:
    """The same database URL with its host and port replaced by the proxy's."""
    head, _, tail = url.partition("@")
    _, _, rest = tail.partition("/")
    return f"{head}@127.0.0.1:{port}/{rest}"


async def test_a_partition_then_resets_between_workers_and_postgres_lose_nothing(
    settings: Settings,
) -> None:
    assert settings.database_url is not None
    async with open_store(settings) as db, FaultProxy(("127.0.0.1", 5432)) as proxy:
        boot = await bootstrap(db, settings)
        # Slow runs (about 0.6 s each), so that many are in flight when the network fails.
        common = {"worker_concurrency": 16, "sim_ttft_ms": 200, "sim_tokens_per_second": 20}
        direct_env = worker_env(settings, **common)
        proxied_env = {
            **worker_env(settings, **common),
            "BULLPEN_DATABASE_URL": _through(settings.database_url, proxy.port),
        }
        with worker_pool(proxied_env) as proxied, worker_pool(direct_env) as direct:
            proxied.start(2)
            task_ids = await enqueue(db, boot.workspace_id, boot.agent_id, TASKS)
            await _until(lambda: proxy.accepted >= 2, "the proxied workers never connected")
            await asyncio.sleep(2)  # every worker is busy before the network fails
            direct.start(1)
            proxy.set_mode(Mode.PARTITION)
            await asyncio.sleep(4 * LEASE_S)  # leases lapse; the direct worker takes over
            proxy.set_mode(Mode.PASS)
            await asyncio.sleep(1)
            proxy.set_mode(Mode.RESET)
            await asyncio.sleep(2)
            proxy.set_mode(Mode.PASS)
            healed = proxy.accepted
            left = await wait_terminal(db, task_ids, LEASE_S + 90)
            result = await ledger(db, task_ids)
            still_running = [p.pid for p in proxied.alive()]
            reconnected = proxy.accepted - healed
            logs = "\n".join(log[-2000:] for log in proxied.logs)
    assert left == 0, f"{left} runs not terminal; {result.summary()}\n{logs}"
    assert result.clean, result.summary()
    assert any(a > 1 for a in result.attempts.values()), "the partition caught no run in flight"
    assert len(still_running) == 2, f"a partitioned worker exited\n{logs}"
    assert reconnected >= 1, "no partitioned worker reconnected after the resets"


async def _until(check: Callable[[], bool], message: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(message)
        await asyncio.sleep(0.05)
