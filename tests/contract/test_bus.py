"""The event buses' contract: in-process (memory), PostgreSQL LISTEN/NOTIFY and Redis Streams.

Two `SharedBus` instances on the same transport settings stand for two processes, "here" (the
publisher) and "there". Every test has its own NOTIFY channel or stream key, so parallel runs
never cross, and every connection carries its process's name (`application_name`,
`client_name`), so a test can kill exactly one process's listening connection. A `Gate` (a TCP
relay that can be cut) makes a real outage between one process and the service.

Whatever the bus, a subscriber may miss events; what must hold is that it then knows it
(`lagged`), so it re-reads the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit
from uuid import UUID, uuid4

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from bullpen.domain.events import EventKind, RunEvent
from bullpen.errors import RateLimited, Unavailable
from bullpen.streams.bus.base import Bus
from bullpen.streams.bus.memory import Hub, MemoryBus, Subscriber
from bullpen.streams.bus.postgres import PgNotify
from bullpen.streams.bus.redis import RedisStreams
from bullpen.streams.bus.shared import SharedBus, Transport, decode, encode
from tests.support.gate import Gate, moved
from tests.support.postgres import PG_ADMIN_URL

REDIS_URL = os.environ.get("BULLPEN_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SHARED = ["postgres", "redis"]
ALL = ["memory", *SHARED]
# How long "arrives" may take: generous, the machine is shared with other suites.
SOON_S = 10.0
STOP_S = 5.0  # a bus's exit: at most a 2 s last try at its outbox, then cancellation
RUN_ID = UUID("00000000-0000-4000-8000-000000000001")


def _events(task_id: UUID, seqs: range, text: str = "") -> list[RunEvent]:
    """Text events of one run of `task_id`, each with its own data."""
    return [
        RunEvent(RUN_ID, task_id, seq, EventKind.TEXT, {"text": f"{text}{seq}"}) for seq in seqs
    ]


async def _read(sub: Subscriber, count: int) -> list[RunEvent]:
    """The subscriber's next `count` events; fails if it lags or goes quiet."""
    got: list[RunEvent] = []
    while len(got) < count:
        event = await sub.get(SOON_S)
        assert event is not None, f"got {len(got)} of {count} events, then lagged={sub.lagged}"
        got.append(event)
    return got


async def _until(condition: Callable[[], bool], what: str, timeout: float = SOON_S) -> None:
    """Poll a counter that has no event to wait on."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"{what} did not happen within {timeout} s")


async def _stop(bus: SharedBus) -> bool:
    """Leave a running bus; whether it stopped by itself within STOP_S.

    A cancelled Redis listener can swallow its cancellation and run on (see
    `test_a_bus_stops_promptly_right_after_its_listener_delivers_an_event`): cancelling it
    again ends it, so that one bug fails one test instead of hanging every test that stops a
    bus.
    """
    stopping = asyncio.create_task(bus.__aexit__(None, None, None))
    done, _ = await asyncio.wait({stopping}, timeout=STOP_S)
    while not stopping.done():
        for task in bus._tasks:
            task.cancel()
        await asyncio.wait({stopping}, timeout=0.1)
    stopping.result()
    return bool(done)


def _with_query(url: str, **params: str) -> str:
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


@dataclass
class Wire:
    """One test's transport settings: every process made from it shares one channel or key."""

    kind: str
    url: str
    tag: str  # the test's own: prefixes its process names, so kills never reach another test
    make_transport: Callable[[str], Transport]
    kill_connection: Callable[[str], Awaitable[int]]  # by connection name; how many were killed

    @property
    def max_payload(self) -> int:
        return PgNotify.max_payload if self.kind == "postgres" else RedisStreams.max_payload

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        assert parts.hostname is not None and parts.port is not None
        return parts.hostname, parts.port

    def transport(self, process: str, *, port: int | None = None) -> Transport:
        """The transport of one process, straight to the service or through `port`."""
        url = self.url if port is None else moved(self.url, port)
        name = "application_name" if self.kind == "postgres" else "client_name"
        return self.make_transport(_with_query(url, **{name: f"{self.tag}-{process}"}))

    async def kill_listener(self, process: str) -> int:
        """Kill the process's listening connection (its bus reconnects)."""
        return await self.kill_connection(f"{self.tag}-{process}")

    @asynccontextmanager
    async def bus(
        self, process: str, hub: Hub | None = None, *, port: int | None = None
    ) -> AsyncIterator[SharedBus]:
        """A running process's bus, once its listener listens."""
        bus = SharedBus(self.transport(process, port=port), hub)
        await bus.__aenter__()
        try:
            await asyncio.wait_for(bus.connected.wait(), SOON_S)
            yield bus
        finally:
            await _stop(bus)


async def _postgres_wire(pg_available: bool) -> AsyncGenerator[Wire, None]:
    if not pg_available:
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}")
    tag = uuid4().hex[:12]
    channel = f"bullpen_test_{tag}"

    async def kill_listening(name: str) -> int:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            killed = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = $1 AND query LIKE 'LISTEN%'",
                name,
            )
        finally:
            await conn.close()
        return len(killed)

    def make(url: str) -> Transport:
        return PgNotify(url, channel=channel)

    yield Wire("postgres", PG_ADMIN_URL, tag, make, kill_listening)


async def _redis_wire() -> AsyncGenerator[Wire, None]:
    admin = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=5)
    try:
        await admin.ping()
    except (OSError, RedisError) as err:
        await admin.aclose()
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {err!r}")
    tag = uuid4().hex[:12]
    key = f"bullpen:test:{tag}"

    async def kill_reading(name: str) -> int:
        clients = await admin.client_list()
        reading = [c["id"] for c in clients if c["name"] == name and c["cmd"] == "xread"]
        for client_id in reading:
            await admin.client_kill_filter(_id=client_id)
        return len(reading)

    def make(url: str) -> Transport:
        return RedisStreams(url, key=key, maxlen=10_000)

    try:
        yield Wire("redis", REDIS_URL, tag, make, kill_reading)
    finally:
        await admin.delete(key)
        await admin.aclose()


@asynccontextmanager
async def _open_wire(kind: str, pg_available: bool) -> AsyncIterator[Wire]:
    wires = _postgres_wire(pg_available) if kind == "postgres" else _redis_wire()
    async with contextlib.aclosing(wires):
        yield await anext(wires)


@pytest.fixture(params=SHARED)
async def wire(request: pytest.FixtureRequest, pg_available: bool) -> AsyncIterator[Wire]:
    """Each two-process test runs once over PostgreSQL NOTIFY and once over Redis Streams."""
    async with _open_wire(request.param, pg_available) as opened:
        yield opened


StartBus = Callable[[Hub], AbstractAsyncContextManager[Bus]]


@asynccontextmanager
async def _memory_bus(hub: Hub) -> AsyncIterator[Bus]:
    yield MemoryBus(hub)


@pytest.fixture(params=ALL)
async def start_bus(request: pytest.FixtureRequest, pg_available: bool) -> AsyncIterator[StartBus]:
    """Each one-process test runs once per bus; the bus is built over the test's hub."""
    if request.param == "memory":
        yield _memory_bus
        return
    async with _open_wire(request.param, pg_available) as opened:

        def start(hub: Hub) -> AbstractAsyncContextManager[Bus]:
            return opened.bus("here", hub)

        yield start


# --- messages ---------------------------------------------------------------------------------


def test_a_large_batch_splits_into_messages_under_the_limit_that_decode_restores() -> None:
    task_id = uuid4()
    batch = _events(task_id, range(1, 2001), text="x" * 100)
    messages = encode("origin-a", batch, PgNotify.max_payload)
    assert len(messages) > 1
    assert max(len(message) for message in messages) <= PgNotify.max_payload
    decoded = [decode(message) for message in messages]
    assert {origin for origin, _, _ in decoded} == {"origin-a"}
    assert [event for _, events, _ in decoded for event in events] == batch
    assert all(not stubs for _, _, stubs in decoded)


def test_messages_stay_within_the_limit_in_bytes_and_are_packed_full() -> None:
    rng = random.Random(7)
    task_id = uuid4()
    # Multi-byte text: the limit is in bytes, not characters.
    batch = [
        RunEvent(RUN_ID, task_id, seq, EventKind.TEXT, {"text": "é€" * rng.randrange(0, 80)})
        for seq in range(1, 500)
    ]
    envelope = len(b'{"o":"o","e":[]}')
    for limit in (600, 601, 757, 1000):
        messages = encode("o", batch, limit)
        assert max(len(message) for message in messages) <= limit
        decoded = [decode(message) for message in messages]
        assert [event for _, events, _ in decoded for event in events] == batch
        assert all(not stubs for _, _, stubs in decoded)
        # As few messages as fit: none could also have carried the next one's first event.
        for message, (_, (first, *_), _) in zip(messages, decoded[1:], strict=False):
            alone = encode("o", [first], limit)[0]
            assert len(message) + len(b",") + len(alone) - envelope > limit


def test_an_event_too_large_for_one_message_travels_as_a_stub_without_data() -> None:
    task_id, other = uuid4(), uuid4()
    small = _events(task_id, range(1, 2))[0]
    big = RunEvent(RUN_ID, task_id, 2, EventKind.TEXT, {"text": "x" * 20_000})
    after = _events(other, range(3, 4))[0]
    messages = encode("o", [small, big, after], PgNotify.max_payload)
    assert max(len(message) for message in messages) <= PgNotify.max_payload
    decoded = [decode(message) for message in messages]
    assert [event for _, events, _ in decoded for event in events] == [small, after]
    assert set().union(*(stubs for _, _, stubs in decoded)) == {task_id}
    assert b"null" in messages[0] and b"x" * 100 not in b"".join(messages)


# --- one process ------------------------------------------------------------------------------


async def test_a_subscriber_gets_its_own_processes_events_of_its_task_once_in_order(
    start_bus: StartBus,
) -> None:
    task_id, other = uuid4(), uuid4()
    async with start_bus(Hub()) as bus:
        with bus.open(task_id, uuid4()) as sub:
            ours, theirs = _events(task_id, range(1, 6)), _events(other, range(1, 6))
            bus.publish([event for pair in zip(ours, theirs, strict=True) for event in pair])
            assert await _read(sub, 5) == ours
            # A shared bus hears its own messages back: it must skip them.
            assert await sub.get(0.5) is None
            assert not sub.lagged


async def test_the_third_subscriber_over_a_limit_of_two_is_refused_with_503_until_one_closes(
    start_bus: StartBus,
) -> None:
    task_id = uuid4()
    async with start_bus(Hub(max_subscribers=2)) as bus:
        first, second = bus.open(task_id, uuid4()), bus.open(task_id, uuid4())
        with pytest.raises(Unavailable) as refused:
            bus.open(task_id, uuid4())
        assert refused.value.status == 503
        assert refused.value.retry_after is not None and refused.value.retry_after > 0
        assert bus.subscriber_count == 2
        first.close()
        first.close()  # idempotent: frees one place, not two
        assert bus.subscriber_count == 1
        with bus.open(task_id, uuid4()) as third:
            assert bus.subscriber_count == 2
            with pytest.raises(Unavailable):
                bus.open(uuid4(), uuid4())
        assert third.closed and bus.subscriber_count == 1
        second.close()
        assert bus.subscriber_count == 0


async def test_a_workspace_over_its_limit_gets_429_while_another_workspace_may_still_open(
    start_bus: StartBus,
) -> None:
    busy, calm = uuid4(), uuid4()
    async with start_bus(Hub(max_per_workspace=1)) as bus:
        held = bus.open(uuid4(), busy)
        with pytest.raises(RateLimited) as refused:
            bus.open(uuid4(), busy)
        assert refused.value.status == 429
        assert refused.value.retry_after is not None and refused.value.retry_after > 0
        with bus.open(uuid4(), calm):
            assert bus.subscriber_count == 2
        held.close()
        with bus.open(uuid4(), busy):
            assert bus.subscriber_count == 1
        assert bus.subscriber_count == 0


async def test_a_subscriber_that_does_not_read_lags_empties_its_buffer_and_resumes_after_reset(
    start_bus: StartBus,
) -> None:
    task_id = uuid4()
    async with start_bus(Hub(buffer=4)) as bus:
        with bus.open(task_id, uuid4()) as slow:
            bus.publish(_events(task_id, range(1, 11)))
            assert slow.lagged
            assert bus.hub.lagged_total == 1
            # Lagged: get answers at once, so the reader goes back to the store.
            assert await asyncio.wait_for(slow.get(60.0), SOON_S) is None
            slow.reset()
            later = _events(task_id, range(11, 13))
            bus.publish(later)
            # The four events buffered before the overflow are gone.
            assert await _read(slow, 2) == later
            assert not slow.lagged and bus.hub.lagged_total == 1


async def test_get_returns_none_after_its_wait_when_nothing_comes(start_bus: StartBus) -> None:
    async with start_bus(Hub()) as bus:
        with bus.open(uuid4(), uuid4()) as sub:
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await sub.get(0.3) is None
            # Timers may fire a clock tick early; a loaded machine may fire them late.
            assert 0.25 <= loop.time() - started < 3.0
            assert not sub.lagged


async def test_get_returns_as_soon_as_an_event_arrives_while_it_waits(start_bus: StartBus) -> None:
    task_id = uuid4()
    async with start_bus(Hub()) as bus:
        with bus.open(task_id, uuid4()) as sub:
            waiting = asyncio.create_task(sub.get(60.0))
            await asyncio.sleep(0)  # let it start waiting
            (event,) = _events(task_id, range(1, 2))
            bus.publish([event])
            assert await asyncio.wait_for(waiting, SOON_S) == event


# --- two processes ----------------------------------------------------------------------------


async def test_a_bus_stops_promptly_right_after_its_listener_delivers_an_event(
    wire: Wire,
) -> None:
    task_id = uuid4()
    async with wire.bus("here") as here:
        for attempt in range(3):
            bus = SharedBus(wire.transport(f"there-{attempt}"))
            await bus.__aenter__()
            await asyncio.wait_for(bus.connected.wait(), SOON_S)
            with bus.open(task_id, uuid4()) as far:
                event = _events(task_id, range(attempt, attempt + 1))
                here.publish(event)
                assert await _read(far, 1) == event
            # Stopping now cancels the listener as it sends its next read.
            assert await _stop(bus), f"stopping hung: a cancelled listener ran on ({attempt=})"


async def test_a_subscriber_gets_its_tasks_events_from_both_processes_once_each_in_order(
    wire: Wire,
) -> None:
    task_id, other = uuid4(), uuid4()
    async with wire.bus("here") as here, wire.bus("there") as there:
        with (
            here.open(task_id, uuid4()) as near,
            there.open(task_id, uuid4()) as far,
            there.open(other, uuid4()) as bystander,
        ):
            ours, theirs = _events(task_id, range(1, 6)), _events(other, range(1, 4))
            here.publish([*ours[:2], *theirs, *ours[2:]])
            assert await _read(far, 5) == ours
            assert await _read(bystander, 3) == theirs
            assert await _read(near, 5) == ours
            # Every server delivers in order, so a process that heard its own message back
            # would see a copy of it before the other process's reply.
            reply = _events(task_id, range(6, 7))
            there.publish(reply)
            assert await _read(near, 1) == reply
            assert await _read(far, 1) == reply
            closing = _events(task_id, range(7, 8))
            here.publish(closing)
            assert await _read(far, 1) == closing
            assert await _read(near, 1) == closing
            assert (here.received_messages, there.received_messages) == (1, 2)
            assert not (near.lagged or far.lagged or bystander.lagged)


async def test_an_event_from_another_process_wakes_a_waiting_get(wire: Wire) -> None:
    task_id = uuid4()
    async with wire.bus("here") as here, wire.bus("there") as there:
        with there.open(task_id, uuid4()) as far:
            waiting = asyncio.create_task(far.get(60.0))
            await asyncio.sleep(0)  # let it start waiting
            (event,) = _events(task_id, range(1, 2))
            here.publish([event])
            assert await asyncio.wait_for(waiting, SOON_S) == event


async def test_two_thousand_events_in_one_publish_reach_the_other_process_complete_in_order(
    wire: Wire,
) -> None:
    task_id = uuid4()
    batch = _events(task_id, range(1, 2001), text="x" * 100)
    # A buffer for the whole batch: the messages may all arrive before the reader runs.
    async with wire.bus("here") as here, wire.bus("there", Hub(buffer=len(batch))) as there:
        with there.open(task_id, uuid4()) as far:
            here.publish(batch)
            assert await _read(far, len(batch)) == batch
            assert not far.lagged
            if wire.kind == "postgres":
                # Split under NOTIFY's payload limit. The last message can arrive before the
                # sender has counted it (its NOTIFY's reply comes after the delivery).
                await _until(lambda: here.sent_messages > 1, "the batch sent as several messages")


async def test_an_event_too_large_for_one_message_lags_and_wakes_the_other_processes_reader(
    wire: Wire,
) -> None:
    task_id = uuid4()
    before, after = _events(task_id, range(1, 2)), _events(task_id, range(3, 4))
    big = RunEvent(RUN_ID, task_id, 2, EventKind.TEXT, {"text": "x" * (wire.max_payload + 12_000)})
    async with wire.bus("here") as here, wire.bus("there") as there:
        with here.open(task_id, uuid4()) as near, there.open(task_id, uuid4()) as far:
            waiting = asyncio.create_task(far.get(60.0))
            await asyncio.sleep(0)  # let it start waiting
            here.publish([*before, big, *after])
            # Woken at once with nothing: it knows to re-read the store.
            assert await asyncio.wait_for(waiting, SOON_S) is None
            assert far.lagged
            # The publishing process's own reader got the event itself.
            assert await _read(near, 3) == [*before, big, *after]


async def test_a_listener_that_loses_its_connection_lags_its_subscribers_and_hears_again(
    wire: Wire,
) -> None:
    task_id = uuid4()
    async with wire.bus("here") as here, wire.bus("there") as there:
        with there.open(task_id, uuid4()) as far:
            first = _events(task_id, range(1, 2))
            here.publish(first)
            assert await _read(far, 1) == first
            failures = there.failures
            assert await wire.kill_listener("there") == 1
            await _until(lambda: there.failures > failures, "noticing the lost connection")
            await asyncio.wait_for(there.connected.wait(), SOON_S)
            # Whatever was published while it was away is only in the store.
            assert far.lagged
            far.reset()
            later = _events(task_id, range(2, 4))
            here.publish(later)
            assert await _read(far, 2) == later


async def test_events_published_before_a_listener_connects_need_not_arrive_but_later_ones_do(
    wire: Wire,
) -> None:
    task_id = uuid4()
    hub = Hub()
    async with wire.bus("here") as here:
        with hub.open(task_id, uuid4()) as late:
            early = _events(task_id, range(1, 2))
            here.publish(early)
            await _until(lambda: here.sent_messages == 1, "sending the early event")
            async with wire.bus("there", hub):
                # Connecting tells the subscriber that the bus may have missed something.
                assert late.lagged
                late.reset()
                later = _events(task_id, range(2, 3))
                here.publish(later)
                received = await _read(late, 1)
                if received == early:  # allowed, never required
                    received = await _read(late, 1)
                assert received == later


async def test_events_published_during_an_outage_reach_the_other_process_in_order_after_it(
    wire: Wire,
) -> None:
    task_id = uuid4()
    async with (
        Gate(*wire.address) as gate,
        wire.bus("here", port=gate.port) as here,
        wire.bus("there") as there,
    ):
        with there.open(task_id, uuid4()) as far:
            before = _events(task_id, range(1, 3))
            here.publish(before)
            assert await _read(far, 2) == before
            # Sent and acknowledged, so the cut cannot make it send them again.
            await _until(lambda: here.sent_messages == 1, "acknowledging the first events")
            gate.cut()
            during = _events(task_id, range(3, 53))
            here.publish(during)
            sent, failures = here.sent_messages, here.failures
            await _until(lambda: here.failures >= failures + 2, "failing twice", 3 * SOON_S)
            assert here.sent_messages == sent
            gate.restore()
            assert await _read(far, len(during)) == during
            assert here.dropped_events == 0


@pytest.mark.parametrize("kind", SHARED)
async def test_publishing_while_the_service_is_unreachable_neither_raises_nor_blocks(
    kind: str,
) -> None:
    task_id = uuid4()
    closed_port = 1
    transport: Transport = (
        PgNotify(moved(PG_ADMIN_URL, closed_port), channel=f"bullpen_test_{uuid4().hex}")
        if kind == "postgres"
        else RedisStreams(moved(REDIS_URL, closed_port), key=f"bullpen:test:{uuid4().hex}")
    )
    bus = SharedBus(transport)
    await bus.__aenter__()
    with bus.open(task_id, uuid4()) as sub:
        batch = _events(task_id, range(1, 101))
        bus.publish(batch)
        # This process's readers do not depend on the transport.
        assert await _read(sub, len(batch)) == batch
        await _until(lambda: bus.failures >= 2, "failing to reach the service", 3 * SOON_S)
        assert bus.sent_messages == 0 and not bus.connected.is_set()
        assert bus.dropped_events == 0
    # The outbox still holds the batch: leaving gives it one bounded last try.
    assert await _stop(bus), f"stopping took over {STOP_S} s"
