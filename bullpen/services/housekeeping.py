"""Housekeeping: delete expired idempotency keys and sessions in bounded batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from bullpen.errors import BullpenError
from bullpen.store import idempotency as idempotency_keys
from bullpen.store import identity
from bullpen.store.base import Store

log = logging.getLogger(__name__)

BATCH = 1000


async def sweep(store: Store, now: datetime) -> int:
    """Delete what has expired, one bounded batch per transaction; returns rows deleted."""
    total = 0
    for delete in (idempotency_keys.delete_expired, identity.delete_expired_sessions):
        while True:
            async with store.write() as conn:
                deleted = await delete(conn, now, BATCH)
            total += deleted
            if deleted < BATCH:
                break
            await asyncio.sleep(0)  # let requests in between batches
    return total


class Housekeeper:
    """Runs `sweep` every `interval_s` while open."""

    def __init__(self, store: Store, clock: Callable[[], datetime], interval_s: float) -> None:
        self._store = store
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
                deleted = await sweep(self._store, self._clock())
            except BullpenError as err:
                log.warning("housekeeping failed: %s", err.detail)
                continue
            if deleted:
                log.info("housekeeping deleted %d expired rows", deleted)
