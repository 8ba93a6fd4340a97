"""The in-process fan-out: bounded per-subscriber buffers, limits on subscribers.

Every bus delivers through a `Hub`: the in-process bus is a hub alone; the shared buses
(PostgreSQL NOTIFY, Redis Streams) hand it what other processes published. A subscriber whose
buffer fills is marked lagged and woken: it drops what it holds and re-reads the store, so a
slow reader never slows a producer or any other reader.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from uuid import UUID

from bullpen.domain.events import EventKind, RunEvent
from bullpen.errors import RateLimited, Unavailable

DEFAULT_BUFFER = 1024
_RETRY_AFTER_S = 1.0


class Subscriber:
    """One reader's bounded buffer of one task's events; `close` it when done (idempotent)."""

    __slots__ = (
        "_buffer",
        "_capacity",
        "_hub",
        "_waiter",
        "closed",
        "lagged",
        "task_id",
        "workspace_id",
    )

    def __init__(self, hub: Hub, task_id: UUID, workspace_id: UUID, capacity: int) -> None:
        self._hub = hub
        self.task_id = task_id
        self.workspace_id = workspace_id
        self._capacity = capacity
        self._buffer: deque[RunEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.lagged = False
        self.closed = False

    def offer(self, event: RunEvent) -> None:
        """Buffer an event, or mark the subscriber lagged when its buffer is full."""
        if self.lagged:
            return
        if len(self._buffer) >= self._capacity:
            self.lag()
            return
        self._buffer.append(event)
        self._wake()

    def lag(self) -> None:
        """Something may be missing: drop the buffer and let the reader re-read the store."""
        if not self.lagged:
            self._hub.lagged_total += 1
        self.lagged = True
        self._buffer.clear()
        self._wake()

    def reset(self) -> None:
        """The reader is about to re-read the store: start buffering again."""
        self._buffer.clear()
        self.lagged = False

    async def get(self, wait_s: float) -> RunEvent | None:
        """The next event; None when `wait_s` passes without one or the subscriber lagged."""
        if self._buffer:
            return self._buffer.popleft()
        if self.lagged:
            return None
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(wait_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self._buffer.popleft() if self._buffer else None

    def close(self) -> None:
        """Stop receiving; frees the subscriber's place under the limits."""
        if not self.closed:
            self.closed = True
            self._hub.remove(self)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Hub:
    """This process's subscribers, keyed by task; at most `max_subscribers` at once, and at
    most `max_per_workspace` for one workspace."""

    def __init__(
        self,
        *,
        buffer: int = DEFAULT_BUFFER,
        max_subscribers: int = 10_000,
        max_per_workspace: int = 10_000,
    ) -> None:
        self._buffer = buffer
        self._max = max_subscribers
        self._max_per_workspace = max_per_workspace
        self._by_task: dict[UUID, set[Subscriber]] = {}
        self._per_workspace: dict[UUID, int] = {}
        self.count = 0
        self.lagged_total = 0  # times a subscriber was sent back to the store
        # Called after a delivery that held a run's status change (tasks change with them).
        self.status_watchers: list[Callable[[], None]] = []

    def open(self, task_id: UUID, workspace_id: UUID) -> Subscriber:
        """A new subscriber to `task_id`'s events; 503 or 429 (with Retry-After) beyond the
        limits."""
        self.admit(workspace_id)
        sub = Subscriber(self, task_id, workspace_id, self._buffer)
        self._by_task.setdefault(task_id, set()).add(sub)
        return sub

    def admit(self, workspace_id: UUID) -> None:
        """Count one more live stream of the workspace, or raise 503 or 429 (with
        Retry-After) beyond the limits; `release` it when the stream ends."""
        if self.count >= self._max:
            raise Unavailable(
                f"this server holds its limit of {self._max} live streams; retry shortly",
                retry_after=_RETRY_AFTER_S,
            )
        held = self._per_workspace.get(workspace_id, 0)
        if held >= self._max_per_workspace:
            raise RateLimited(
                f"this workspace holds its limit of {self._max_per_workspace} live streams "
                "on this server; close one or retry shortly",
                retry_after=_RETRY_AFTER_S,
            )
        self._per_workspace[workspace_id] = held + 1
        self.count += 1

    def release(self, workspace_id: UUID) -> None:
        """A stream counted by `admit` has ended."""
        left = self._per_workspace[workspace_id] - 1
        if left:
            self._per_workspace[workspace_id] = left
        else:
            del self._per_workspace[workspace_id]
        self.count -= 1

    def remove(self, sub: Subscriber) -> None:
        """Forget a subscriber (called by `Subscriber.close`)."""
        subs = self._by_task.get(sub.task_id)
        if subs is None or sub not in subs:
            return
        subs.discard(sub)
        if not subs:
            del self._by_task[sub.task_id]
        self.release(sub.workspace_id)

    def deliver(self, events: Sequence[RunEvent]) -> None:
        """Hand each event to its task's subscribers; tell the status watchers when a run
        started or ended (its task's status changed with it)."""
        by_task = self._by_task
        status = False
        for event in events:
            if event.kind is EventKind.STATUS or event.kind is EventKind.END:
                status = True
            subs = by_task.get(event.task_id)
            if subs:
                for sub in subs:
                    sub.offer(event)
        if status:
            for watcher in self.status_watchers:
                watcher()

    def lag(self, task_ids: Iterable[UUID] | None = None) -> None:
        """Make the subscribers of `task_ids` (all, when None) re-read the store: events for
        them may have been lost on the way."""
        if task_ids is None:
            groups: Iterable[set[Subscriber]] = list(self._by_task.values())
        else:
            groups = [s for t in task_ids if (s := self._by_task.get(t))]
        for subs in groups:
            for sub in subs:
                sub.lag()

    def has_subscribers(self, task_id: UUID) -> bool:
        """Whether anyone here listens to `task_id`."""
        return task_id in self._by_task


class MemoryBus:
    """One process: publishing is delivering."""

    def __init__(self, hub: Hub | None = None) -> None:
        self.hub = hub or Hub()

    def publish(self, events: Sequence[RunEvent]) -> None:
        """Deliver committed events to this process's subscribers (never blocks)."""
        self.hub.deliver(events)

    def open(self, task_id: UUID, workspace_id: UUID) -> Subscriber:
        """A subscriber to one task's events (see `Hub.open`)."""
        return self.hub.open(task_id, workspace_id)

    @property
    def subscriber_count(self) -> int:
        """How many subscribers are registered (for metrics and leak tests)."""
        return self.hub.count
