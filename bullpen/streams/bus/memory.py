"""The in-process bus: bounded per-subscriber queues; a full queue marks the subscriber lagged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from uuid import UUID

from bullpen.domain.events import RunEvent


class MemorySubscription:
    """One subscriber's bounded buffer."""

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[RunEvent] = asyncio.Queue(maxsize)
        self.lagged = False

    def offer(self, event: RunEvent) -> None:
        """Queue an event, or mark the subscriber lagged (it resumes from the store)."""
        if self.lagged:
            return
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.lagged = True

    async def get(self, wait_s: float) -> RunEvent | None:
        """The next event, or None after `wait_s` seconds."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            pass
        try:
            async with asyncio.timeout(wait_s):
                return await self._queue.get()
        except TimeoutError:
            return None

    def reset(self) -> None:
        """Drop buffered events after a lag; the reader re-reads the store."""
        while not self._queue.empty():
            self._queue.get_nowait()
        self.lagged = False


class MemoryBus:
    """Subscribers keyed by task id, all in this process."""

    def __init__(self, buffer: int = 1024) -> None:
        self._buffer = buffer
        self._subs: dict[UUID, set[MemorySubscription]] = {}

    def publish(self, events: Sequence[RunEvent]) -> None:
        """Deliver each event to its task's subscribers."""
        for event in events:
            subs = self._subs.get(event.task_id)
            if subs:
                for sub in subs:
                    sub.offer(event)

    @asynccontextmanager
    async def subscribe(self, task_id: UUID) -> AsyncIterator[MemorySubscription]:
        """Register a subscriber for the life of the context."""
        sub = MemorySubscription(self._buffer)
        self._subs.setdefault(task_id, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(task_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[task_id]

    @property
    def subscriber_count(self) -> int:
        """How many subscribers are registered (for metrics and leak tests)."""
        return sum(len(s) for s in self._subs.values())
