"""The worker: claims queued runs under a lease, executes them, renews and finishes them."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from bullpen.agents.llm import run_llm
from bullpen.domain.events import EventKind
from bullpen.domain.status import RunStatus
from bullpen.errors import BullpenError
from bullpen.gateway.client import GatewayClient
from bullpen.gateway.providers import ProviderRegistry
from bullpen.store import events as event_store
from bullpen.store import runs as run_store
from bullpen.store.base import Connection, Store
from bullpen.store.runs import ClaimedRun, RunOutcome
from bullpen.streams.eventlog import EventLog

log = logging.getLogger(__name__)

_CLAIM_BATCH = 32


class Worker:
    """Runs up to `concurrency` runs at once in this process."""

    def __init__(
        self,
        store: Store,
        eventlog: EventLog,
        gateway: GatewayClient,
        providers: ProviderRegistry,
        *,
        concurrency: int,
        lease: timedelta,
        poll_s: float,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._eventlog = eventlog
        self._gateway = gateway
        self._providers = providers
        self._concurrency = concurrency
        self._lease = lease
        self._poll_s = poll_s
        self._clock = clock
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._inflight: dict[UUID, asyncio.Task[None]] = {}
        self._cancelled: set[UUID] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def notify(self) -> None:
        """Wake the claim loop now (a run was enqueued in this process)."""
        self._wake.set()

    async def cancel(self, run_id: UUID, *, wait_s: float = 5.0) -> bool:
        """Stop a run this process executes and end it `cancelled`; False if not held here."""
        task = self._inflight.get(run_id)
        if task is None:
            return False
        self._cancelled.add(run_id)
        task.cancel()
        await asyncio.wait([task], timeout=wait_s)
        return True

    @property
    def inflight(self) -> int:
        """Runs executing right now."""
        return len(self._inflight)

    async def __aenter__(self) -> Worker:
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="bullpen-claim"),
            asyncio.create_task(self._lease_loop(), name="bullpen-lease"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        running = list(self._inflight.values())
        for task in running:
            task.cancel()
        await asyncio.gather(*self._tasks, *running, return_exceptions=True)

    async def _claim_loop(self) -> None:
        while True:
            free = self._concurrency - len(self._inflight)
            claimed: list[ClaimedRun] = []
            if free > 0:
                try:
                    async with self._store.write() as conn:
                        claimed = await run_store.claim(
                            conn,
                            owner=self.owner,
                            limit=min(free, _CLAIM_BATCH),
                            now=self._clock(),
                            lease=self._lease,
                        )
                except BullpenError as err:
                    log.warning("claim failed: %s", err.detail)
            for run in claimed:
                task = asyncio.create_task(self._execute(run), name=f"bullpen-run-{run.id}")
                self._inflight[run.id] = task
                task.add_done_callback(functools.partial(self._done, run.id))
            if len(claimed) == _CLAIM_BATCH and free > _CLAIM_BATCH:
                continue  # more may be waiting
            try:
                async with asyncio.timeout(self._poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    def _done(self, run_id: UUID, _task: asyncio.Task[None]) -> None:
        self._inflight.pop(run_id, None)
        self._cancelled.discard(run_id)
        if len(self._inflight) == self._concurrency - 1:
            self._wake.set()  # the worker was full: queued runs may be waiting for this slot

    async def _lease_loop(self) -> None:
        interval = self._lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            try:
                async with self._store.write() as conn:
                    now = self._clock()
                    await run_store.renew(
                        conn,
                        owner=self.owner,
                        run_ids=list(self._inflight),
                        now=now,
                        lease=self._lease,
                    )
                    if await run_store.requeue_expired(conn, now=now):
                        self._wake.set()
            except BullpenError as err:
                log.warning("lease renewal failed: %s", err.detail)

    async def _execute(self, run: ClaimedRun) -> None:
        last = 0
        if run.attempt > 1:
            async with self._store.read() as conn:
                last = await event_store.last_seq(conn, run.id)
        writer = self._eventlog.writer(run.id, run.task_id, run.workspace_id, last)
        writer.emit(EventKind.STATUS, {"status": "running", "attempt": run.attempt})
        try:
            if run.agent_adapter != "llm":
                raise BullpenError(f"adapter {run.agent_adapter!r} is not available yet")
            outcome = await run_llm(run, writer, self._gateway, self._providers)
        except asyncio.CancelledError:
            if run.id not in self._cancelled:
                raise  # shutdown: the lease expires and the run is delivered again
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            outcome = _ended(RunStatus.CANCELLED, "cancelled on request")
        except BullpenError as err:
            outcome = _ended(RunStatus.FAILED, err.detail)
        except Exception:
            log.exception("run %s crashed", run.id)
            outcome = _ended(RunStatus.FAILED, "internal error while executing the run")
        now = self._clock()

        async def change(conn: Connection) -> bool:
            return await run_store.finish(
                conn, run_id=run.id, attempt=run.attempt, outcome=outcome, now=now
            )

        try:
            applied = await self._eventlog.commit_final(
                writer, EventKind.END, {"status": outcome.status.value}, change
            )
        except BullpenError as err:
            log.warning("could not record the end of run %s: %s", run.id, err.detail)
            return
        if not applied:
            log.warning("run %s attempt %s lost its lease; result dropped", run.id, run.attempt)


def _ended(status: RunStatus, error: str) -> RunOutcome:
    return RunOutcome(
        status=status,
        result=None,
        error=error,
        first_token_at=None,
        ttft_ms=None,
        provider=None,
        model=None,
        input_tokens=None,
        output_tokens=None,
    )
