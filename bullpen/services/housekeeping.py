"""Housekeeping: delete expired idempotency keys, sessions, run events, task changes, audit
events, usage ledger rows and ended tasks in bounded batches; decide approvals left undecided
past their time by their default outcome; charge the budget pools of relay processes that
died (`bullpen.services.spend.RelayBudgets`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from bullpen.errors import BullpenError
from bullpen.store import budgets as budget_store
from bullpen.store import changes as task_changes
from bullpen.store import events as run_events
from bullpen.store import idempotency as idempotency_keys
from bullpen.store import identity
from bullpen.store import retention as retained
from bullpen.store.base import Store

log = logging.getLogger(__name__)

BATCH = 1000


@dataclass(frozen=True, slots=True)
class Retention:
    """How long run events and task changes are kept, and how many rows one cleanup
    transaction deletes."""

    events: timedelta = timedelta(days=30)
    event_batch: int = 5_000
    # Finding 11a: audit events, usage ledger rows and ended tasks (with their runs, events,
    # comments and steps); None keeps them forever. `batch` rows per transaction.
    audit: timedelta | None = timedelta(days=365)
    usage: timedelta | None = timedelta(days=365)
    tasks: timedelta | None = timedelta(days=90)
    batch: int = 1_000


async def sweep(store: Store, now: datetime, retention: Retention = Retention()) -> dict[str, int]:
    """Delete what has expired, one bounded batch per transaction; returns rows deleted, by
    kind."""
    cutoff = now - retention.events
    # The events of ended runs go by the tasks' retention when that is shorter, before the
    # tasks themselves: a task's delete then cascades to few rows.
    events_cutoff = cutoff if retention.tasks is None else max(cutoff, now - retention.tasks)
    jobs: list[tuple[str, Callable[..., Awaitable[int]], datetime, int]] = [
        ("idempotency_keys", idempotency_keys.delete_expired, now, BATCH),
        ("sessions", identity.delete_expired_sessions, now, BATCH),
        ("run_events", run_events.delete_expired, events_cutoff, retention.event_batch),
        ("task_changes", task_changes.delete_expired, cutoff, retention.event_batch),
    ]
    if retention.audit is not None:
        jobs.append(
            ("audit_events", retained.delete_old_audit, now - retention.audit, retention.batch)
        )
    if retention.usage is not None:
        jobs.append(
            ("cost_events", retained.delete_old_usage, now - retention.usage, retention.batch)
        )
        # The latency histogram goes with the ledger (it outlives the runs it counts).
        jobs.append(
            ("ttft_hours", retained.delete_old_ttft, now - retention.usage, retention.batch)
        )
    if retention.tasks is not None:
        jobs.append(("tasks", retained.delete_ended_tasks, now - retention.tasks, retention.batch))
    totals: dict[str, int] = {}
    for kind, delete, when, batch in jobs:
        total = 0
        while True:
            async with store.write() as conn:
                deleted = await delete(conn, when, batch)
            total += deleted
            # Tasks go leaves first: a short batch may have made parents leaves, so they go
            # on until a batch finds nothing; the rest stop at the first short batch.
            if deleted == 0 or (deleted < batch and kind != "tasks"):
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
        *,
        expire_approvals: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self._expire_approvals = expire_approvals
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
            if self._expire_approvals is not None:
                try:
                    expired = await self._expire_approvals()
                except BullpenError as err:
                    log.warning("expiring approvals failed: %s", err.detail)
                else:
                    if expired:
                        log.info("housekeeping expired %d undecided approvals", expired)
            try:
                async with self._store.write() as conn:
                    charged = await budget_store.charge_expired(conn, self._clock())
            except BullpenError as err:
                log.warning("charging expired budget pools failed: %s", err.detail)
            else:
                if charged:
                    log.info("housekeeping charged %d budget pools left by a dead process", charged)
            try:
                deleted = sum((await sweep(self._store, self._clock(), self._retention)).values())
            except BullpenError as err:
                log.warning("housekeeping failed: %s", err.detail)
                continue
            if deleted:
                log.info("housekeeping deleted %d expired rows", deleted)
