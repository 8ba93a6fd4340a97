"""The bus seam: publish committed events, subscribe per task."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol
from uuid import UUID

from bullpen.domain.events import RunEvent


class Subscription(Protocol):
    """Live events of one task, in publish order; may lag and then must resume from the store."""

    lagged: bool

    async def get(self, wait_s: float) -> RunEvent | None:
        """The next event, or None when `wait_s` seconds pass without one."""
        ...

    def reset(self) -> None:
        """Drop what is buffered and clear `lagged`; the reader re-reads the store."""
        ...


class Bus(Protocol):
    """Fan-out of committed run events to subscribers."""

    def publish(self, events: Sequence[RunEvent]) -> None:
        """Deliver events to every subscriber of their task (never blocks)."""
        ...

    def subscribe(self, task_id: UUID) -> AbstractAsyncContextManager[Subscription]:
        """Listen to one task's events for the life of the context."""
        ...
