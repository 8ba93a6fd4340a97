"""A bus shared by several processes: local delivery at once, the rest through a transport.

`publish` hands events to this process's subscribers directly and queues them for the
transport (PostgreSQL NOTIFY or a Redis stream); a sender task ships the queue in as few
messages as fit, and a listener task delivers what other processes published. Messages carry
the publishing process's origin so it skips its own.

Nothing here is the source of truth: when the listener (re)connects, when a message cannot
carry an event (too large), or when the outbox overflows, the subscribers concerned are marked
lagged and re-read the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from uuid import UUID

import orjson

from bullpen.domain.events import EventKind, RunEvent
from bullpen.streams.bus.memory import Hub, Subscriber

log = logging.getLogger(__name__)

OUTBOX_LIMIT = 100_000  # events waiting for the transport; beyond, the oldest are dropped
_RETRY_S = 0.5
_RECONNECT_S = 1.0

Deliver = Callable[[str | bytes], None]


class Transport(Protocol):
    """Carries opaque messages between processes."""

    name: str
    max_payload: int  # bytes per message

    async def send(self, payloads: list[bytes]) -> None:
        """Send messages in order; raise when they could not be sent."""
        ...

    async def listen(self, deliver: Deliver, connected: Callable[[], None]) -> None:
        """Call `deliver` for every message from now on; `connected` once listening. Returns
        or raises when the connection is lost (the caller listens again)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


def message_head(origin: str) -> bytes:
    """How every message from `origin` starts: a process skips its own by it, unparsed."""
    return b'{"o":"' + origin.encode() + b'","e":['


def encode(origin: str, events: Sequence[RunEvent], max_payload: int) -> list[bytes]:
    """Messages of at most `max_payload` bytes carrying `events` in order. An event too large
    for one message travels as a stub without data: its receivers re-read the store."""
    head = message_head(origin)
    room = max_payload - len(head) - 2
    out: list[bytes] = []
    items: list[bytes] = []
    size = 0
    for event in events:
        item = orjson.dumps(
            [event.run_id.hex, event.task_id.hex, event.seq, event.kind.value, event.data]
        )
        if len(item) > room:
            item = orjson.dumps(
                [event.run_id.hex, event.task_id.hex, event.seq, event.kind.value, None]
            )
        if items and size + 1 + len(item) > room:
            out.append(head + b",".join(items) + b"]}")
            items, size = [], 0
        items.append(item)
        size += len(item) + (1 if len(items) > 1 else 0)
    if items:
        out.append(head + b",".join(items) + b"]}")
    return out


def decode(message: str | bytes) -> tuple[str, list[RunEvent], set[UUID]]:
    """(origin, events, tasks whose events arrived as stubs) of one message."""
    body: Any = orjson.loads(message)
    events: list[RunEvent] = []
    stubs: set[UUID] = set()
    for run_hex, task_hex, seq, kind, data in body["e"]:
        task_id = UUID(task_hex)
        if data is None:
            stubs.add(task_id)
        else:
            events.append(RunEvent(UUID(run_hex), task_id, seq, EventKind(kind), data))
    return body["o"], events, stubs


class SharedBus:
    """A bus over a transport; `async with` runs its sender and listener."""

    def __init__(self, transport: Transport, hub: Hub | None = None) -> None:
        self.hub = hub or Hub()
        self.transport = transport
        self.origin = secrets.token_hex(8)
        # This process's own messages come back on the transport (as text or bytes).
        self._own_head = message_head(self.origin)
        self._own_head_text = self._own_head.decode()
        self._outbox: deque[RunEvent] = deque()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.connected = asyncio.Event()
        self.sent_messages = 0
        self.received_messages = 0
        self.dropped_events = 0
        self.failures = 0

    def publish(self, events: Sequence[RunEvent]) -> None:
        """Deliver here now; queue for the other processes (never blocks)."""
        if not events:
            return
        self.hub.deliver(events)
        self._outbox.extend(events)
        excess = len(self._outbox) - OUTBOX_LIMIT
        if excess > 0:
            # The transport is away or far behind: the others re-read the store on reconnect.
            for _ in range(excess):
                self._outbox.popleft()
            self.dropped_events += excess
        self._wake.set()

    def open(self, task_id: UUID, workspace_id: UUID) -> Subscriber:
        """A subscriber to one task's events (see `Hub.open`)."""
        return self.hub.open(task_id, workspace_id)

    @property
    def subscriber_count(self) -> int:
        """Subscribers in this process."""
        return self.hub.count

    async def __aenter__(self) -> SharedBus:
        name = self.transport.name
        self._tasks = [
            asyncio.create_task(self._send_loop(), name=f"bullpen-bus-{name}-send"),
            asyncio.create_task(self._listen_loop(), name=f"bullpen-bus-{name}-listen"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Ship what is queued (a last run's end) before going, if the transport lets us.
        if self._outbox:
            with contextlib.suppress(Exception, TimeoutError):
                async with asyncio.timeout(2.0):
                    await self._ship()
        # Cancel until done: a task can swallow one cancellation (Python 3.11's wait_for,
        # which redis-py sends its commands through, may return the result instead:
        # gh-86296). `asyncio.wait` also lets a cancellation of the caller through.
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        await self.transport.close()

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._ship()
            except Exception as err:  # the transport is away: keep the events, try again
                self.failures += 1
                log.warning("%s bus: could not publish (retrying): %r", self.transport.name, err)
                await asyncio.sleep(_RETRY_S)
                self._wake.set()

    async def _ship(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, deque()
            try:
                payloads = encode(self.origin, batch, self.transport.max_payload)
                await self.transport.send(payloads)
            except BaseException:
                self._outbox.extendleft(reversed(batch))  # in front again, order kept
                raise
            self.sent_messages += len(payloads)

    def _deliver(self, message: str | bytes) -> None:
        if isinstance(message, str):
            own = message.startswith(self._own_head_text)
        else:
            own = message.startswith(self._own_head)
        if own:
            return
        try:
            _origin, events, stubs = decode(message)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("%s bus: ignored a malformed message", self.transport.name)
            return
        self.received_messages += 1
        if events:
            self.hub.deliver(events)
        if stubs:
            self.hub.lag(stubs)

    def _connected(self) -> None:
        # Whatever was published while we were not listening is only in the store.
        self.hub.lag()
        self.connected.set()

    async def _listen_loop(self) -> None:
        while True:
            try:
                await self.transport.listen(self._deliver, self._connected)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning(
                    "%s bus: listening failed (streams here fall back to the store): %r",
                    self.transport.name,
                    err,
                )
            self.connected.clear()
            self.failures += 1
            await asyncio.sleep(_RECONNECT_S)
