"""The usage ledger: cost rows of relay calls, written in batches off the request path."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from bullpen.errors import BullpenError
from bullpen.store import budgets as budget_store
from bullpen.store import gateway as gateway_store
from bullpen.store.base import Store
from bullpen.store.budgets import Draw

log = logging.getLogger(__name__)

# Usage rows kept in memory while the database is away; beyond it the oldest are dropped.
_MAX_PENDING = 100_000


# Rows waiting for a commit, each with what its call drew from a budget pool (settled in the
# same transaction) and the future its caller waits on (None once answered).
_Batch = list[tuple[dict[str, Any] | None, Draw | None, asyncio.Future[None] | None]]


class UsageLedger:
    """Cost rows of relay calls, group-committed by one background task.

    `record` returns a future that resolves once the row's batch committed. The relay does not
    wait for it: a call's end is not held up by a database round trip (under load on
    PostgreSQL that was most of what the relay added to a stream). A batch gathers the rows
    of calls that end within `linger_s` of its first (or until `max_batch` are in), so that a
    commit's fixed cost is shared: committed one by one, at 150 calls a second on SQLite,
    they took an eighth of the API's CPU. Leaving the ledger (a graceful stop) commits every
    row still queued; only a hard crash of the process can lose the rows of calls that ended
    in its last `linger_s` or so, fewer than the calls still streaming, whose rows a crash
    loses anyway. A batch is one statement (on PostgreSQL one round trip, no BEGIN/COMMIT),
    and there up to `in_flight` batches commit at once: rows arriving while others commit go
    out in a batch of their own rather than waiting for theirs. While the database is away
    the rows are kept (bounded) and the futures resolve anyway.
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        max_batch: int = 500,
        in_flight: int = 4,
        linger_s: float = 0.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._max_batch = max_batch
        self._in_flight = in_flight
        self._linger_s = linger_s
        self._pending: _Batch = []
        self._committing: set[asyncio.Task[bool]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._away = False
        self.written = 0
        self.batches = 0  # committed

    async def __aenter__(self) -> UsageLedger:
        self._task = asyncio.create_task(self._run(), name="usage-ledger")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._committing:
            await asyncio.wait(self._committing)
        while self._pending and await self._commit(self._take()):
            pass

    def record(self, row: dict[str, Any] | None, draw: Draw | None = None) -> asyncio.Future[None]:
        """Queue one row (every `cost_events` column but `id`) and what its call drew from a
        budget pool (settled with it); the future says it committed."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append((row, draw, future))
        self._wake.set()
        return future

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self._linger_s > 0 and len(self._pending) < self._max_batch:
                await asyncio.sleep(self._linger_s)  # the rows of calls ending meanwhile join
            self._wake.clear()
            if self._away:
                await asyncio.sleep(1.0)  # the database was away: try again shortly
                self._away = False
            while self._pending and len(self._committing) < self._in_flight:
                if self._store.is_sqlite:
                    # One writer, on this event loop: a task per batch would only add a turn.
                    if not await self._commit(self._take()):
                        self._wake.set()  # the kept rows go again after the pause
                        break
                    continue
                task = asyncio.create_task(self._commit(self._take()), name="usage-ledger-batch")
                self._committing.add(task)
                task.add_done_callback(self._committed)

    def _take(self) -> _Batch:
        batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
        return batch

    def _committed(self, task: asyncio.Task[bool]) -> None:
        self._committing.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            log.error("usage rows lost to an unexpected error: %r", err)
        if self._pending:
            self._wake.set()

    async def _commit(self, batch: _Batch) -> bool:
        """Commit one batch; False when the database was away (the rows are kept)."""
        rows = [row for row, _, _ in batch if row is not None]
        draws = [draw for _, draw, _ in batch if draw is not None]
        try:
            if draws:  # the rows and the settling of what they drew, in one transaction
                async with self._store.write() as conn:
                    await gateway_store.record_costs(conn, rows)
                    await budget_store.settle_draws(conn, draws, self._clock())
            else:
                async with self._store.autocommit() as conn:
                    await gateway_store.record_costs(conn, rows)
            self.written += len(rows)
            self.batches += 1
            return True
        except BullpenError as err:  # the database is away: keep the rows for the next try
            log.warning("could not record %d usage rows yet: %s", len(rows), err.detail)
            self._away = True
            self._pending[:0] = [(row, draw, None) for row, draw, _ in batch]
            if len(self._pending) > _MAX_PENDING:
                lost = len(self._pending) - _MAX_PENDING
                del self._pending[:lost]
                log.error("dropped %d usage rows: the database was away too long", lost)
            return False
        finally:
            # Answered whatever happened: a bug here must not hang the callers as well.
            for _, _, future in batch:
                if future is not None and not future.done():
                    future.set_result(None)
