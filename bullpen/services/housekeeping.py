"""Housekeeping: delete expired idempotency keys, sessions, run events and task changes in
bounded batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bullpen.errors import BullpenError
from bullpen.store import changes as task_changes
from bullpen.store import events as run_events
from bullpen.store import idempotency as idempotency_keys
from bullpen.store import identity
from bullpen.store.base import Store

log = logging.getLogger(__name__)

BATCH = 1000


@dataclass(frozen=True, slots=True)
class Retention:
    """How long run events and task changes are kept, and how many rows one cleanup
    transaction deletes."""

    events: timedelta = timedelta(days=30)
    event_batch: int = 5_000


async def sweep(store: Store, now: datetime, retention: Retention = Retention()) -> dict[str, int]:
    """Delete what has expired, one bounded batch per transaction; returns rows deleted, by
    kind."""
    cutoff = now - retention.events
    jobs: list[tuple[str, Callable[..., Awaitable[int]], datetime, int]] = [
        ("idempotency_keys", idempotency_keys.delete_expired, now, BATCH),
        ("sessions", identity.delete_expired_sessions, now, BATCH),
        ("run_events", run_events.delete_expired, cutoff, retention.event_batch),
        ("task_changes", task_changes.delete_expired, cutoff, retention.event_batch),
    ]
    totals: dict[str, int] = {}
    for kind, delete, when, batch in jobs:
        total = 0
        while True:
            async with store.write() as conn:
                deleted = await delete(conn, when, batch)
            total += deleted
            if deleted < batch:
                break
            await asyncio.sleep(0)  # let requests in between batches
        totals[kind] = total
    return totals


class Housekeeper:
    """Runs `sweep` every `interval_s` while open."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        interval_s: float,
        retention: Retention = Retention(),
    ) -> None:
        self._store = store
        self._retention = retention
        self._clock = clock
        self._interval = interval_s
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Housekeeper:
        self._task = asyncio.create_task(self._loop(), name="bullpen-housekeeping")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                deleted = sum((await sweep(self._store, self._clock(), self._retention)).values())
            except BullpenError as err:
                log.warning("housekeeping failed: %s", err.detail)
                continue
            if deleted:
                log.info("housekeeping deleted %d expired rows", deleted)
