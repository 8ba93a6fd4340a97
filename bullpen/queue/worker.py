"""The worker: claims queued runs under a lease, executes them, renews and finishes them.

Every write of a delivery is fenced by (run id, attempt): events (the event log checks the
holder in each group commit), lease renewals, the final state, a transient failure's re-queue.
A worker that lost its lease (paused past it, cut off from the database) finds its writes
refused and stops the agent. SIGTERM drains: no new claims, in-flight runs get a grace period,
then whatever still runs is released back to the queue unharmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING
from uuid import UUID

from bullpen.agents.base import Adapter, Related, RunContext, TaskBrief, TeamPort
from bullpen.domain.breakers import BreakerLimits
from bullpen.domain.events import EventKind, RunEvent
from bullpen.domain.runs import ClaimedRun, Held, Redelivery, RetryPolicy, RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.errors import BullpenError
from bullpen.queue import breakers
from bullpen.store import budgets as budget_store
from bullpen.store import claims as claim_store
from bullpen.store import events as event_store
from bullpen.store import runs as run_store
from bullpen.store.base import Connection, Store
from bullpen.streams.eventlog import Ending, EventLog, RunWriter, append_ends

if TYPE_CHECKING:
    from bullpen.telemetry.spans import Tracing

log = logging.getLogger(__name__)

_CLAIM_BATCH = 32


class _Stop(Enum):
    """Why an execution was stopped from outside."""

    CANCEL = "cancel"  # someone cancelled the task: the run ends `cancelled`
    LOST = "lost"  # the lease moved on: write nothing more
    RELEASE = "release"  # draining: give the run back to the queue


@dataclass(frozen=True, slots=True)
class WorkerTuning:
    """How often the worker looks at the queue and its runs."""

    concurrency: int
    lease: timedelta
    poll_s: float
    cancel_poll_s: float = 0.5
    drain_grace_s: float = 30.0
    # Slots no single workspace may fill: a workspace that submits while another floods the
    # queue finds a slot free at once instead of waiting for a run to end.
    reserved_slots: int = 1
    crash_marker: str | None = None  # fault injection: see Settings.fault_crash_marker
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breakers: BreakerLimits = field(default_factory=BreakerLimits)  # the instance's defaults


class Worker:
    """Runs up to `concurrency` runs at once in this process."""

    def __init__(
        self,
        store: Store,
        eventlog: EventLog,
        adapters: Mapping[str, Adapter],
        team: TeamPort,
        *,
        tuning: WorkerTuning,
        clock: Callable[[], datetime],
        publish: Callable[[list[RunEvent]], None],
        announce: Callable[[], None] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._tracing = tracing
        self._eventlog = eventlog
        self._adapters = adapters
        self._team = team
        self._tuning = tuning
        self._clock = clock
        self._publish = publish
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._inflight: dict[UUID, asyncio.Task[None]] = {}
        self._claimed: dict[UUID, ClaimedRun] = {}  # the deliveries in flight here
        self._by_workspace: dict[UUID, int] = {}  # how many of them per workspace
        self._stops: dict[UUID, _Stop] = {}
        self._ending: set[UUID] = set()  # runs past their agent, their outcome being recorded
        self._tasks: list[asyncio.Task[None]] = []
        self._draining = False
        # The last claim left runs waiting that it had room for (an agent at its cap, a
        # retry backing off ...): every run that ends here may free what they wait for.
        self._held_back = False
        # Tells the other processes' workers to look at the queue (PostgreSQL: NOTIFY).
        self._announce = announce
        self.completed = 0
        self.redelivered = 0
        self.dead_lettered = 0

    def notify(self) -> None:
        """Wake the claim loop now (a run was enqueued)."""
        self._wake.set()

    async def cancel(self, run_id: UUID, *, wait_s: float = 5.0) -> bool:
        """Stop a run this process executes and end it `cancelled`; False if not held here."""
        return await self._stop(run_id, _Stop.CANCEL, wait_s)

    @property
    def inflight(self) -> int:
        """Runs executing right now."""
        return len(self._inflight)

    async def __aenter__(self) -> Worker:
        self._tasks = [
            asyncio.create_task(self._claim_loop(), name="bullpen-claim"),
            asyncio.create_task(self._lease_loop(), name="bullpen-lease"),
            asyncio.create_task(self._cancel_loop(), name="bullpen-cancel-watch"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain(self._tuning.drain_grace_s)

    async def drain(self, grace_s: float) -> None:
        """Stop claiming; let in-flight runs finish for `grace_s`, then release the rest."""
        self._draining = True
        claim = self._tasks[0] if self._tasks else None
        if claim is not None:
            claim.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await claim
        running = list(self._inflight.values())
        if running and grace_s > 0:
            log.info("draining: %d runs in flight, up to %.0f s", len(running), grace_s)
            await asyncio.wait(running, timeout=grace_s)
        left = list(self._inflight)
        if left:
            log.info("draining: releasing %d runs back to the queue", len(left))
            await asyncio.gather(*(self._stop(run_id, _Stop.RELEASE, 10.0) for run_id in left))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _stop(self, run_id: UUID, why: _Stop, wait_s: float) -> bool:
        task = self._inflight.get(run_id)
        if task is None:
            return False
        self._stops.setdefault(run_id, why)
        task.cancel()
        await asyncio.wait([task], timeout=wait_s)
        return True

    def _lost(self, run_id: UUID) -> None:
        task = self._inflight.get(run_id)
        # A run whose outcome is being recorded is no longer running once that commits, which
        # a renewal in the moment before its task ends would report as a lost lease; the
        # fenced commit itself says whether the lease held.
        if task is not None and run_id not in self._stops and run_id not in self._ending:
            log.warning("run %s: lease lost; stopping it", run_id)
            self._stops[run_id] = _Stop.LOST
            task.cancel()

    async def _claim_loop(self) -> None:
        while not self._draining:
            free = self._tuning.concurrency - len(self._inflight)
            claimed: list[ClaimedRun] = []
            if free > 0:
                try:
                    claimed = await self._claim(min(free, _CLAIM_BATCH))
                except BullpenError as err:
                    log.warning("claim failed: %s", err.detail)
                except Exception:  # the loop must outlive any one failure
                    log.exception("claim failed unexpectedly")
                    await asyncio.sleep(1.0)
            for run in claimed:
                task = asyncio.create_task(self._execute(run), name=f"bullpen-run-{run.id}")
                self._inflight[run.id] = task
                self._claimed[run.id] = run
                self._by_workspace[run.workspace_id] = (
                    self._by_workspace.get(run.workspace_id, 0) + 1
                )
                task.add_done_callback(functools.partial(self._done, run.id))
            if len(claimed) == _CLAIM_BATCH and free > _CLAIM_BATCH:
                continue  # more may be waiting
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tuning.poll_s):
                    await self._wake.wait()
            self._wake.clear()

    async def _claim(self, limit: int) -> list[ClaimedRun]:
        # Most wake-ups (a run ended) find nothing queued: one read, and no claim.
        async with self._store.read() as conn:
            if not await claim_store.any_queued(conn):
                self._held_back = False
                return []
        async with self._store.write() as conn:
            now = self._clock()
            took = await claim_store.claim(
                conn,
                owner=self.owner,
                limit=limit,
                now=now,
                lease=self._tuning.lease,
                room=self._room,
                lost_below=self._lost_below(),
            )
            started = took.runs
            if started:  # runs beyond an agent's runs-per-hour go back, and it is paused
                started = await breakers.check_starts(conn, started, self._tuning.breakers, now)
        self._held_back = took.held_back
        return started

    def _lost_below(self) -> int | None:
        """While this worker holds a quarantined run, it takes no other (see `claim`)."""
        at = self._tuning.retry.quarantine_at
        held = any(run.lost_leases >= at for run in self._claimed.values())
        return at if held else None

    def _room(self, workspace_id: UUID) -> int:
        """How many more runs of this workspace this worker takes now."""
        share = self._tuning.concurrency - self._tuning.reserved_slots
        return max(1, share) - self._by_workspace.get(workspace_id, 0)

    def _done(self, run_id: UUID, _task: asyncio.Task[None]) -> None:
        run = self._claimed.pop(run_id, None)
        if run is not None:
            left = self._by_workspace.pop(run.workspace_id, 0) - 1
            if left > 0:
                self._by_workspace[run.workspace_id] = left
        self._inflight.pop(run_id, None)
        self._stops.pop(run_id, None)
        self._ending.discard(run_id)
        # Every ended run frees a slot something queued may wait for: this worker's, its
        # workspace's share, or its agent's `max_concurrent_runs` (whichever process runs the
        # next one). This process has the free slot, so it looks now rather than at the
        # poll; a draining one claims nothing, so it asks the other processes to look.
        if self._draining:
            if self._held_back and self._announce is not None:
                self._announce()
        else:
            self._wake.set()

    def _holding(self) -> list[Held]:
        return [Held(run.id, run.attempt) for run in self._claimed.values()]

    async def _lease_loop(self) -> None:
        """Renew this worker's leases and reap other workers' expired ones."""
        interval = self._tuning.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(interval)
            await self._renew_leases()

    async def _renew_leases(self) -> None:
        try:
            async with self._store.write() as conn:
                now = self._clock()
                lost = await run_store.renew(
                    conn, owner=self.owner, held=self._holding(), now=now, lease=self._tuning.lease
                )
                reaped = await reap(conn, now=now, policy=self._tuning.retry)
        except BullpenError as err:
            log.warning("lease renewal failed: %s", err.detail)
            return
        except Exception:
            log.exception("lease renewal failed unexpectedly")
            return
        for h in lost:
            self._lost(h.run_id)
        self._after_redelivery(reaped)

    def _after_redelivery(self, redelivered: list[tuple[Redelivery, RunEvent | None]]) -> None:
        ended = [event for _, event in redelivered if event is not None]
        if ended:
            self._publish(ended)
        if any(r.status is not RunStatus.QUEUED for r, _ in redelivered):
            self._wake.set()  # a run that ended may have woken a task waiting for it
        for r, _ in redelivered:
            if r.status is RunStatus.QUEUED:
                self.redelivered += 1
            elif r.status is RunStatus.FAILED:
                self.dead_lettered += 1
                log.warning("run %s dead-lettered: %s", r.run_id, r.error)
        if any(r.status is RunStatus.QUEUED for r, _ in redelivered):
            self._wake.set()

    async def _cancel_loop(self) -> None:
        """Cancellations asked through another process reach this one within `cancel_poll_s`."""
        while True:
            await asyncio.sleep(self._tuning.cancel_poll_s)
            if not self._inflight:
                continue
            try:
                async with self._store.read() as conn:
                    asked = await run_store.cancel_requested(conn, list(self._inflight))
            except BullpenError as err:
                log.warning("cancel check failed: %s", err.detail)
                continue
            except Exception:
                log.exception("cancel check failed unexpectedly")
                continue
            for run_id in asked:
                # A run may have ended while the query ran: a KeyError here once ended this
                # loop for good, and no later cancel reached this worker's runs.
                task = self._inflight.get(run_id)
                if task is not None and run_id not in self._stops:
                    self._stops[run_id] = _Stop.CANCEL
                    task.cancel()

    async def _execute(self, run: ClaimedRun) -> None:
        tracing = self._tracing
        if tracing is None:
            await self._deliver(run)
            return
        # The delivery's span continues the trace the run was enqueued under; what it
        # enqueues (a delegated subtask) continues this one.
        span = tracing.start_run(run)
        outcome = None
        try:
            with tracing.current(span):
                outcome = await self._deliver(run)
        finally:
            tracing.end_run(span, outcome)

    async def _deliver(self, run: ClaimedRun) -> RunOutcome | None:
        """Execute one delivery and record its end; the outcome, None if it was given back
        or its lease lost."""
        last = 0
        if run.attempt > 1:
            async with self._store.read() as conn:
                last = await event_store.last_seq(conn, run.id)
        writer = self._eventlog.writer(
            run.id,
            run.task_id,
            run.workspace_id,
            last,
            attempt=run.attempt,
            on_lost=functools.partial(self._lost, run.id),
        )
        # Marks the delivery: text after it belongs to this attempt only.
        writer.emit(EventKind.STATUS, {"status": "running", "attempt": run.attempt})
        if self._tuning.crash_marker is not None and self._tuning.crash_marker in run.prompt:
            log.error(
                "run %s carries the fault-injection crash marker: killing this process", run.id
            )
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            adapter = self._adapters.get(run.agent_adapter)
            if adapter is None:
                raise BullpenError(
                    f"this worker does not run {run.agent_adapter!r} agents "
                    "(see BULLPEN_PROCESS_ALLOW for `process` agents)"
                )
            outcome = await adapter.run(await self._context(run, writer))
        except asyncio.CancelledError:
            why = self._stops.get(run.id)
            if why is None:
                raise  # shutdown without drain: the lease expires and the run is delivered again
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            if why is _Stop.LOST:
                return None
            if why is _Stop.RELEASE:
                await self._release(run, writer)
                return None
            outcome = _ended(RunStatus.CANCELLED, "cancelled on request")
        except BullpenError as err:  # http and process agents raise; llm agents return
            writer.emit(EventKind.ERROR, {"message": err.detail, "code": err.slug})
            outcome = _ended(RunStatus.FAILED, err.detail, transient=err.transient, code=err.slug)
        except Exception:
            log.exception("run %s crashed", run.id)
            outcome = _ended(RunStatus.FAILED, "internal error while executing the run")
        self._ending.add(run.id)
        if outcome.status is RunStatus.FAILED and outcome.transient:
            await self._retry_later(run, writer, outcome)
            return outcome
        now = self._clock()

        async def change(conn: Connection) -> bool:
            woken: list[UUID] = []
            finished = await run_store.finish(
                conn, run_id=run.id, attempt=run.attempt, outcome=outcome, now=now, woken=woken
            )
            if woken:  # what waited for this task was queued again: claim it now
                self._store.after_commit(self._wake.set)
            if finished:  # after the run's ledger rows, in the same transaction
                await breakers.after_run(conn, run, outcome, self._tuning.breakers, now)
            return finished

        try:
            applied = await self._eventlog.commit_final(
                writer,
                EventKind.END,
                {"status": outcome.status.value},
                change,
                # No coalescing wait for an end someone waits for: a subtask's parent, a
                # task it blocks, or a run held back by its agent's cap.
                urgent=run.parent_id is not None or run.dependents > 0 or self._held_back,
            )
        except BullpenError as err:
            log.warning("could not record the end of run %s: %s", run.id, err.detail)
            return None
        except Exception:  # its lease expires and the run is delivered again
            log.exception("could not record the end of run %s", run.id)
            return None
        if applied:
            self.completed += 1
        else:
            log.warning("run %s attempt %s lost its lease; result dropped", run.id, run.attempt)
            return None
        return outcome

    async def _context(self, run: ClaimedRun, writer: RunWriter) -> RunContext:
        children: tuple[Related, ...] = ()
        blockers: tuple[Related, ...] = ()
        if run.dependencies:  # only tasks that ever had children or blockers read them
            kids, blocks = await self._team.related(run.task_id)
            children, blockers = tuple(kids), tuple(blocks)
        task = TaskBrief(
            id=run.task_id,
            key=run.task_key,
            title=run.title,
            prompt=run.prompt,
            parent_id=run.parent_id,
            children=children,
            blockers=blockers,
        )
        return RunContext(
            run=run, task=task, agent_name=run.agent_name, events=writer, started_at=self._clock()
        )

    async def _retry_later(self, run: ClaimedRun, writer: RunWriter, outcome: RunOutcome) -> None:
        """A transient failure: queue the run again after a backoff, or dead-letter it."""
        try:
            await self._eventlog.flush(writer)
            async with self._store.write() as conn:
                now = self._clock()
                redelivered = await _redeliver(
                    conn,
                    [Held(run.id, run.attempt)],
                    reason=outcome.error or "transient failure",
                    now=now,
                    policy=self._tuning.retry,
                )
                if outcome.calls:  # what the failed delivery spent is spent
                    await budget_store.settle_run(
                        conn,
                        run_id=run.id,
                        workspace_id=run.workspace_id,
                        agent_id=run.agent_id,
                        task_id=run.task_id,
                        calls=outcome.calls,
                        now=now,
                    )
        except BullpenError as err:
            log.warning("could not re-queue run %s: %s", run.id, err.detail)
            return
        self._after_redelivery(redelivered)

    async def _release(self, run: ClaimedRun, writer: RunWriter) -> None:
        try:
            await self._eventlog.flush(writer)
            async with self._store.write() as conn:
                await run_store.release(conn, [Held(run.id, run.attempt)], now=self._clock())
        except BullpenError as err:
            log.warning("could not release run %s (its lease will expire): %s", run.id, err.detail)
            return
        self._wake.set()


async def reap(
    conn: Connection, *, now: datetime, policy: RetryPolicy
) -> list[tuple[Redelivery, RunEvent | None]]:
    """Re-queue or dead-letter runs whose lease expired; returns them with any end event."""
    expired = await run_store.expired(conn, now=now)
    # Their calls in flight never reported usage: charge what was reserved for them.
    await budget_store.charge_held(conn, [held.run_id for held in expired], now)
    return await _redeliver(
        conn,
        expired,
        reason="its worker stopped renewing the lease",
        now=now,
        policy=policy,
        lost=True,
    )


async def _redeliver(
    conn: Connection,
    held: list[Held],
    *,
    reason: str,
    now: datetime,
    policy: RetryPolicy,
    lost: bool = False,
) -> list[tuple[Redelivery, RunEvent | None]]:
    """Fail these deliveries; a run that ends here (dead-letter, cancel) gets its end event."""
    failed = await run_store.fail_deliveries(
        conn, held, reason=reason, now=now, policy=policy, lost=lost
    )
    events = await append_ends(
        conn,
        [
            Ending(
                r.run_id, r.task_id, r.workspace_id, {"status": r.status.value, "error": r.error}
            )
            for r in failed
            if r.status is not RunStatus.QUEUED
        ],
        now,
    )
    ended: dict[UUID, RunEvent] = {event.run_id: event for event in events}
    return [(r, ended.get(r.run_id) if r.status is not RunStatus.QUEUED else None) for r in failed]


def _ended(
    status: RunStatus, error: str, *, transient: bool = False, code: str | None = None
) -> RunOutcome:
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
        transient=transient,
        error_code=code,
    )
