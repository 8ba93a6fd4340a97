"""FC-8: a client dropped at random points of many runs resumes each task's stream with
`Last-Event-ID` and reassembles every run exactly.

Hypothesis draws, per example, a batch of tasks and for each one where its client drops the
connection (after any byte: mid-frame, mid-line, mid-id) and how long it waits before coming
back. For every stream the reassembled ids are `1.1, 1.2, …` with no gap and no repeat, the
events are the ones the store holds and their text is the task's result, the stream ends with
`end` then `close`, and the provider was asked once per run. Each stream's first text and
its close come far sooner than the keep-alive (30 s here, so only the bus can deliver them in
time); one task per example is watched without drops, as a client that never lost its line.

In one process on both backends (SQLite's memory bus, PostgreSQL's NOTIFY bus), and with the
API (`bullpen up`, no worker), a `bullpen worker` and the simulator in separate processes on
PostgreSQL over each shared bus (NOTIFY, Redis Streams). The simulator runs in the test's own
process, which is how its request count can be read.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from bullpen.app import bus_kind, open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import SIMULATED_MODEL, ensure_bootstrap
from bullpen.settings import Settings
from bullpen.simulator.provider import SimConfig, SimulatedProvider
from bullpen.store.base import Store
from bullpen.store.tables import run_events, runs, tasks
from tests.support.cluster import workers
from tests.support.processes import bullpen_up, free_port, process_env
from tests.support.redis_server import REDIS_URL
from tests.support.servers import RunningServer

PROMPT = "Summarise the quarterly report and list the open risks"

# A slowish provider: each run streams for about a second, so drops land while it is live.
SIM = {"sim_ttft_ms": 150.0, "sim_tokens_per_second": 30.0, "sim_response_tokens": 30}
# Long enough that a stream waiting on a missing bus would blow the limits below.
KEEPALIVE_S = 30.0
FIRST_TEXT_WITHIN_S = 10.0
CLOSED_WITHIN_S = 20.0
STREAM_S = 60.0  # a stream not closed by then is stuck
# Hundreds of reconnects per test are the point here, not the rate limits.
UNLIMITED = {
    "rate_limit_key_rps": 100_000.0,
    "rate_limit_key_burst": 100_000,
    "rate_limit_workspace_rps": 100_000.0,
    "rate_limit_workspace_burst": 100_000,
}
# Roughly one whole stream of a run (markers, status, 30 text events, usage, end).
STREAM_BYTES = 2000

# A drop after `cut` bytes of one connection, then a pause before reconnecting: none (the run
# still streams), or long enough that some runs end meanwhile and the resume is all replay.
DROP = st.tuples(st.integers(1, STREAM_BYTES), st.sampled_from((0.0, 0.05, 0.2, 0.6)))
PLANS = st.lists(st.lists(DROP, min_size=2, max_size=5), min_size=1, max_size=6)
# FC-8 as written: one long task, its client dropped three times.
FC8 = [[(90, 0.0), (400, 0.05), (700, 0.2)]]
# Every example streams runs for real seconds: no shrinking (the failing plan is reported as
# drawn), no database of examples (they depend on the server, not only on the plan).
EXAMPLES = examples(
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    # One server (or set of processes) serves every example of a test.
    suppress_health_check=(HealthCheck.function_scoped_fixture,),
)


@dataclass(frozen=True)
class Frame:
    """One SSE frame; markers (`run`, `close`) have no id."""

    id: str | None
    event: str
    data: Any


@dataclass(frozen=True)
class Target:
    """Where the tasks go and what can be checked behind the API."""

    base_url: str
    auth: dict[str, str]
    agent_id: str
    store: Store
    sim: SimulatedProvider


@dataclass
class Reading:
    """What one client got of one task's stream over all its connections."""

    task_id: str
    connections: list[list[Frame]] = field(default_factory=list)
    first_text_s: float | None = None  # since the task was created
    closed_s: float | None = None

    @property
    def events(self) -> list[Frame]:
        """The events with ids, in the order received."""
        return [f for conn in self.connections for f in conn if f.id is not None]


def _frames(buffer: bytearray) -> list[Frame]:
    """Take the complete frames off the front of `buffer`; a cut frame stays behind."""
    out = []
    while (end := buffer.find(b"\n\n")) >= 0:
        block = bytes(buffer[:end])
        del buffer[: end + 2]
        fields = {}
        for line in block.split(b"\n"):
            if not line.startswith(b":"):  # a comment: the keep-alive
                name, _, value = line.partition(b": ")
                fields[name.decode()] = value.decode()
        if fields:
            out.append(Frame(fields.get("id"), fields["event"], orjson.loads(fields["data"])))
    return out


async def _connect(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    last_id: str | None,
    cut: int | None,
    on_frame: Callable[[Frame], None],
) -> bool:
    """One connection resuming after `last_id`, dropped after `cut` bytes (None: read on to
    the end); `on_frame` gets each complete frame as it arrives. True if the server ended it."""
    sent = {**headers, "Accept": "text/event-stream"}
    if last_id is not None:
        sent["Last-Event-ID"] = last_id
    buffer = bytearray()
    taken = 0
    async with http.get(url, headers=sent) as resp:
        assert resp.status == 200, await resp.text()
        while cut is None or taken < cut:
            chunk = await resp.content.read(1 << 16 if cut is None else cut - taken)
            if not chunk:
                assert not buffer, f"the stream ended inside a frame: {bytes(buffer)!r}"
                return True
            taken += len(chunk)
            buffer += chunk
            for frame in _frames(buffer):
                on_frame(frame)
        resp.close()  # drop the connection, as a lost network would
    return False


async def _read(
    http: aiohttp.ClientSession,
    target: Target,
    task_id: str,
    created: float,
    drops: Sequence[tuple[int, float]],
) -> Reading:
    """Follow a task's stream to its `close`, dropping and resuming as `drops` says."""
    loop = asyncio.get_running_loop()
    url = f"{target.base_url}/api/v1/tasks/{task_id}/events"
    reading = Reading(task_id)
    last_id: str | None = None

    def on_frame(frame: Frame) -> None:
        nonlocal last_id
        reading.connections[-1].append(frame)
        if frame.id is not None:
            last_id = frame.id
        if frame.event == "text" and reading.first_text_s is None:
            reading.first_text_s = loop.time() - created
        if frame.event == "close":
            reading.closed_s = loop.time() - created

    async with asyncio.timeout(STREAM_S):
        for cut, pause in [*drops, (None, 0.0)]:
            reading.connections.append([])
            ended = await _connect(http, url, target.auth, last_id, cut, on_frame)
            if reading.closed_s is not None:
                break
            assert not ended, f"the stream ended without a close: {reading.connections}"
            await asyncio.sleep(pause)
    return reading


async def _create_and_read(
    http: aiohttp.ClientSession, target: Target, drops: Sequence[tuple[int, float]]
) -> Reading:
    body = {"prompt": f"{PROMPT} ({uuid.uuid4().hex})", "agent_id": target.agent_id}
    created = asyncio.get_running_loop().time()
    async with http.post(f"{target.base_url}/api/v1/tasks", json=body, headers=target.auth) as r:
        assert r.status == 201, await r.text()
        task_id = str((await r.json())["id"])
    return await _read(http, target, task_id, created, drops)


@dataclass
class Stored:
    """What the store holds for one task."""

    result: str | None
    runs: list[Any]
    events: list[Frame]


async def _stored(store: Store, task_ids: list[str]) -> dict[str, Stored]:
    ids = [uuid.UUID(t) for t in task_ids]
    async with store.read() as conn:
        results = {
            str(row.id): row.result
            for row in await conn.execute(
                sa.select(tasks.c.id, tasks.c.result).where(tasks.c.id.in_(ids))
            )
        }
        task_runs: dict[str, list[Any]] = defaultdict(list)
        for row in await conn.execute(
            sa.select(runs.c.id, runs.c.task_id, runs.c.status, runs.c.attempt).where(
                runs.c.task_id.in_(ids)
            )
        ):
            task_runs[str(row.task_id)].append(row)
        events: dict[str, list[Frame]] = defaultdict(list)
        for row in await conn.execute(
            sa.select(run_events.c.task_id, run_events.c.seq, run_events.c.kind, run_events.c.data)
            .where(run_events.c.task_id.in_(ids))
            .order_by(run_events.c.task_id, run_events.c.seq)
        ):
            events[str(row.task_id)].append(Frame(f"1.{row.seq}", row.kind, row.data))
    return {t: Stored(results.get(t), task_runs[t], events[t]) for t in task_ids}


def _check(reading: Reading, stored: Stored) -> None:
    """The properties of one reassembled stream (see the module docstring)."""
    got = [[f.id or f.event for f in conn] for conn in reading.connections]
    where = f"task {reading.task_id}, got per connection {got}"
    assert len(stored.runs) == 1, where
    (run,) = stored.runs
    assert (run.status, run.attempt) == ("done", 1), where
    opened = Frame(None, "run", {"run_id": str(run.id), "number": 1})
    closed = Frame(None, "close", {"reason": "task-ended", "status": "done"})
    for number, conn in enumerate(reading.connections, 1):
        # Each connection opens with the run's marker (unless dropped inside it); the last
        # one ends with the close, which thus follows the `end` (received on this connection
        # or, for a client dropped right after it, on an earlier one).
        markers = [f for f in conn if f.id is None]
        expected = [opened] if conn else []
        if number == len(reading.connections):
            expected.append(closed)
            assert conn[-1] == closed, where
        assert markers == expected, where
        assert not conn or conn[0] == opened, where
    events = reading.events
    ids = [e.id for e in events]
    assert ids == [f"1.{seq}" for seq in range(1, len(ids) + 1)], f"gap or repeat: {where}"
    assert events == stored.events, where
    assert events[-1].event == "end" and events[-1].data == {"status": "done"}, where
    text = "".join(e.data["text"] for e in events if e.event == "text")
    assert text and text == stored.result, where
    assert reading.first_text_s is not None and reading.first_text_s < FIRST_TEXT_WITHIN_S, where
    assert reading.closed_s is not None and reading.closed_s < CLOSED_WITHIN_S, where


async def _exercise(
    http: aiohttp.ClientSession, target: Target, plans: list[list[tuple[int, float]]]
) -> None:
    """One example: a task per plan plus one watched without drops, all at once."""
    before = target.sim.total_requests
    drops: list[list[tuple[int, float]]] = [[], *plans]
    readings = await asyncio.gather(*(_create_and_read(http, target, d) for d in drops))
    stored = await _stored(target.store, [r.task_id for r in readings])
    for reading in readings:
        _check(reading, stored[reading.task_id])
    assert target.sim.total_requests - before == len(drops)  # one provider call per run


@pytest.mark.timeout(300)
@pytest.mark.with_settings(**SIM, **UNLIMITED, sse_keepalive_s=KEEPALIVE_S)
@examples(EXAMPLES, max_examples=8)
@example(plans=FC8)
@given(plans=PLANS)
async def test_dropped_clients_reassemble_every_run_exactly(
    server: RunningServer,
    http: aiohttp.ClientSession,
    backend: str,
    plans: list[list[tuple[int, float]]],
) -> None:
    assert bus_kind(server.settings) == {"sqlite": "memory", "postgres": "postgres"}[backend]
    sim = server.services.simulator
    assert sim is not None
    agent = str(server.boot.agent_id)
    await _exercise(
        http, Target(server.base_url, server.auth, agent, server.services.store, sim), plans
    )


@pytest.fixture
async def cluster(settings: Settings, bus: str) -> AsyncIterator[Target]:
    """An API process without a worker, a worker process and the simulator, on one
    PostgreSQL database and the `bus`; yielded once the worker has completed a run."""
    config = SimConfig(
        ttft_ms=SIM["sim_ttft_ms"],
        tokens_per_second=SIM["sim_tokens_per_second"],
        response_tokens=int(SIM["sim_response_tokens"]),
        models=(SIMULATED_MODEL,),
    )
    async with SimulatedProvider(config) as sim, open_store(settings) as store:
        secret = load_secret(settings.secret_key, settings.data_dir)
        boot = await ensure_bootstrap(store, secret, utcnow)
        assert boot.api_key is not None
        env = process_env(
            settings,
            sim_url=sim.base_url,
            bus=bus,
            sse_keepalive_s=KEEPALIVE_S,
            workspace_poll_s=KEEPALIVE_S,  # so workspace streams move only on wake-ups
            **UNLIMITED,
            **({"redis_url": REDIS_URL} if bus == "redis" else {}),
        )
        port = free_port()
        with workers(env) as pool:
            pool.start(1)  # it starts while the API does: both take seconds to import
            with bullpen_up({**env, "BULLPEN_WORKER_ENABLED": "false"}, port):
                target = Target(
                    f"http://127.0.0.1:{port}",
                    {"Authorization": f"Bearer {boot.api_key}"},
                    str(boot.agent_id),
                    store,
                    sim,
                )
                async with aiohttp.ClientSession() as http:
                    # The worker is up once it has run a task: examples' clocks exclude its start.
                    await _create_and_read(http, target, [])
                yield target


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize("bus", ["postgres", "redis"])
@examples(EXAMPLES, max_examples=3)
@given(plans=PLANS)
async def test_dropped_clients_reassemble_every_run_across_processes(
    cluster: Target, http: aiohttp.ClientSession, plans: list[list[tuple[int, float]]]
) -> None:
    await _exercise(http, cluster, plans)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize("bus", ["postgres", "redis"])
async def test_the_workspace_stream_follows_a_worker_in_another_process(
    cluster: Target, http: aiohttp.ClientSession
) -> None:
    """Tasks created through the API run in the worker process; the API's workspace stream
    gets each one's creation, start and end in time. Its poll interval is 30 s here, so only
    wake-ups can deliver in time: the API's own enqueue, and the runs' status and end events
    on the bus."""
    url = f"{cluster.base_url}/api/v1/events"
    async with http.get(url, headers={**cluster.auth, "Accept": "text/event-stream"}) as resp:
        assert resp.status == 200
        created = []
        for _ in range(3):
            async with http.post(
                f"{cluster.base_url}/api/v1/tasks",
                json={"prompt": "Say something about streams", "agent_id": cluster.agent_id},
                headers=cluster.auth,
            ) as made:
                assert made.status == 201, await made.text()
                created.append((await made.json())["id"])
        seen: dict[str, list[str]] = defaultdict(list)
        async with asyncio.timeout(CLOSED_WITHIN_S):
            async for line in resp.content:
                if line.startswith(b"data: "):
                    change = orjson.loads(line[6:])
                    seen[change["task_id"]].append(change["status"])
                if all(seen[t][-1:] == ["done"] for t in created):
                    break
    assert {t: seen[t] for t in created} == {t: ["queued", "running", "done"] for t in created}
