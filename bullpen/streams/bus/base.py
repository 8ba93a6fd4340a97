"""The bus seam: publish committed events; open a subscriber to one task's events.

Three buses stand behind it: in-process (`memory`), PostgreSQL LISTEN/NOTIFY (`postgres`) and
Redis Streams (`redis`). Whatever the bus, a subscriber may miss events (a full buffer, a
dropped connection, a message too large to carry); it is then marked lagged and re-reads the
store, which holds every committed event. The bus is only ever the fast path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from uuid import UUID

from bullpen.domain.events import RunEvent
from bullpen.streams.bus.memory import Hub, Subscriber


class Bus(Protocol):
    """Fan-out of committed run events to subscribers, in this process and (for shared
    buses) in every other process on the same database or Redis."""

    hub: Hub

    def publish(self, events: Sequence[RunEvent]) -> None:
        """Deliver events to every subscriber of their task (never blocks)."""
        ...

    def open(self, task_id: UUID, workspace_id: UUID) -> Subscriber:
        """A subscriber to one task's events, counted against the limits (429/503 beyond)."""
        ...

    @property
    def subscriber_count(self) -> int:
        """Subscribers in this process."""
        ...
