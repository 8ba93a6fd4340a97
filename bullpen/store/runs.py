"""Runs as the queue: claim with a lease, renew, re-queue expired, finish under a fence."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store.base import Connection
from bullpen.store.tables import agents, runs, tasks


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """A run a worker now holds, with what it needs to execute it."""

    id: UUID
    task_id: UUID
    workspace_id: UUID
    agent_id: UUID
    attempt: int
    failures: int
    prompt: str
    agent_adapter: str
    agent_config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What a finished run records."""

    status: RunStatus
    result: str | None
    error: str | None
    first_token_at: datetime | None
    ttft_ms: float | None
    provider: str | None
    model: str | None
    input_tokens: int | None
    output_tokens: int | None
    # A transient failure (a provider or the network was away) is retried with backoff; a
    # permanent one (bad config, a refused request) ends the run at once.
    transient: bool = False


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed deliveries are retried: exponential backoff with jitter, then dead-letter."""

    max_attempts: int = 5
    base_s: float = 1.0
    max_s: float = 300.0

    def delay(self, failures: int, rng: random.Random | None = None) -> timedelta:
        """The wait before delivery `failures + 1`: base·2^(failures-1), capped, jittered ±50 %."""
        raw = min(self.max_s, self.base_s * 2 ** max(0, failures - 1))
        return timedelta(seconds=raw * (rng or random).uniform(0.5, 1.0))


@dataclass(frozen=True, slots=True)
class Held:
    """A delivery a worker holds: the run and the attempt its writes are fenced by."""

    run_id: UUID
    attempt: int


# PostgreSQL: one claimer at a time (per database), so fairness and per-agent caps are exact.
_CLAIM_LOCK = 0x6270_636C  # "bpcl"
_RANK_WINDOW = 4  # candidates read per free slot, so capped agents can be skipped


async def claim(
    conn: Connection,
    *,
    owner: str,
    limit: int,
    now: datetime,
    lease: timedelta,
) -> list[ClaimedRun]:
    """Take up to `limit` runs under a lease: fairly across workspaces, then by priority.

    Only runs that are due (`available_at`), of active agents below their
    `max_concurrent_runs`, are taken. Each claim increments the run's attempt: the fence every
    later write of this delivery is checked against.
    """
    if limit < 1:
        return []
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_CLAIM_LOCK)))
    turn = (
        sa.func.row_number()
        .over(
            partition_by=runs.c.workspace_id,
            order_by=(runs.c.priority.desc(), runs.c.queued_at, runs.c.id),
        )
        .label("turn")
    )
    ranked = (
        sa.select(
            runs.c.id,
            runs.c.workspace_id,
            runs.c.agent_id,
            runs.c.priority,
            runs.c.queued_at,
            turn,
        )
        .select_from(runs.join(agents, agents.c.id == runs.c.agent_id))
        .where(
            runs.c.status == RunStatus.QUEUED.value,
            sa.or_(runs.c.available_at.is_(None), runs.c.available_at <= now),
            agents.c.status == "active",
        )
        .subquery("ranked")
    )
    # Max-min fairness over execution slots: a workspace's k-th waiting run comes after every
    # workspace's runs that would leave it with fewer runs in progress.
    busy = (
        sa.select(runs.c.workspace_id, sa.func.count().label("running"))
        .where(runs.c.status == RunStatus.RUNNING.value)
        .group_by(runs.c.workspace_id)
        .subquery("busy")
    )
    share = ranked.c.turn + sa.func.coalesce(busy.c.running, 0)
    window = limit * _RANK_WINDOW
    candidates = list(
        await conn.execute(
            sa.select(ranked.c.id, ranked.c.agent_id)
            .select_from(ranked.outerjoin(busy, busy.c.workspace_id == ranked.c.workspace_id))
            .where(ranked.c.turn <= window)
            .order_by(share, ranked.c.priority.desc(), ranked.c.queued_at, ranked.c.id)
            .limit(window)
        )
    )
    if not candidates:
        return []
    free = await _agent_slots(conn, {row.agent_id for row in candidates})
    chosen: list[UUID] = []
    for row in candidates:
        if free.get(row.agent_id, 0) > 0:
            free[row.agent_id] -= 1
            chosen.append(row.id)
            if len(chosen) == limit:
                break
    if not chosen:
        return []
    target = sa.select(runs.c.id).where(
        runs.c.id.in_(chosen), runs.c.status == RunStatus.QUEUED.value
    )
    if postgres:  # a row another transaction is changing (a cancel) is left for later
        target = target.with_for_update(skip_locked=True)
    claimed = list(
        await conn.execute(
            runs.update()
            .where(runs.c.id.in_(target.scalar_subquery()))
            .values(
                status=RunStatus.RUNNING.value,
                attempt=runs.c.attempt + 1,
                lease_owner=owner,
                lease_expires_at=now + lease,
                started_at=now,
                available_at=None,
            )
            .returning(runs.c.id, runs.c.task_id)
        )
    )
    if not claimed:
        return []
    await conn.execute(
        tasks.update()
        .where(
            tasks.c.id.in_([row.task_id for row in claimed]),
            tasks.c.status == TaskStatus.QUEUED.value,
        )
        .values(status=TaskStatus.RUNNING.value, updated_at=now)
    )
    details = await conn.execute(
        sa.select(
            runs.c.id,
            runs.c.task_id,
            runs.c.workspace_id,
            runs.c.agent_id,
            runs.c.attempt,
            runs.c.failures,
            tasks.c.prompt,
            agents.c.adapter,
            agents.c.config,
        )
        .select_from(
            runs.join(tasks, tasks.c.id == runs.c.task_id).join(
                agents, agents.c.id == runs.c.agent_id
            )
        )
        .where(runs.c.id.in_([row.id for row in claimed]))
    )
    order = {run_id: index for index, run_id in enumerate(chosen)}
    found = [
        ClaimedRun(
            id=row.id,
            task_id=row.task_id,
            workspace_id=row.workspace_id,
            agent_id=row.agent_id,
            attempt=row.attempt,
            failures=row.failures,
            prompt=row.prompt,
            agent_adapter=row.adapter,
            agent_config=dict(row.config),
        )
        for row in details
    ]
    return sorted(found, key=lambda run: order[run.id])


async def _agent_slots(conn: Connection, agent_ids: set[UUID]) -> dict[UUID, int]:
    """How many more runs each agent may start now (its cap minus its running runs)."""
    running = sa.func.count(runs.c.id)
    busy = {
        row.agent_id: int(row.n)
        for row in await conn.execute(
            sa.select(runs.c.agent_id, running.label("n"))
            .where(runs.c.status == RunStatus.RUNNING.value, runs.c.agent_id.in_(agent_ids))
            .group_by(runs.c.agent_id)
        )
    }
    caps = await conn.execute(
        sa.select(agents.c.id, agents.c.max_concurrent_runs).where(agents.c.id.in_(agent_ids))
    )
    return {row.id: max(0, int(row.max_concurrent_runs) - busy.get(row.id, 0)) for row in caps}


async def renew(
    conn: Connection, *, owner: str, held: list[Held], now: datetime, lease: timedelta
) -> list[Held]:
    """Extend the leases this worker still holds; returns the deliveries it no longer holds."""
    if not held:
        return []
    ids = [h.run_id for h in held]
    mine = sa.select(runs.c.id).where(
        runs.c.id.in_(ids), runs.c.lease_owner == owner, runs.c.status == RunStatus.RUNNING.value
    )
    if conn.dialect.name == "postgresql":  # in id order, so concurrent lockers cannot deadlock
        mine = mine.order_by(runs.c.id).with_for_update()
    await conn.execute(
        runs.update()
        .where(runs.c.id.in_(mine.scalar_subquery()))
        .values(lease_expires_at=now + lease)
    )
    current = await holders(conn, ids)
    return [h for h in held if current.get(h.run_id) != h.attempt]


async def holders(conn: Connection, run_ids: list[UUID], *, lock: bool = False) -> dict[UUID, int]:
    """The attempt holding each running run of `run_ids` (runs not running are absent).

    With `lock` (PostgreSQL) the rows are share-locked in id order until commit, so no claim or
    re-queue can move the lease on while the caller writes under the fence.
    """
    if not run_ids:
        return {}
    query = sa.select(runs.c.id, runs.c.attempt).where(
        runs.c.id.in_(run_ids), runs.c.status == RunStatus.RUNNING.value
    )
    if lock and conn.dialect.name == "postgresql":
        query = query.order_by(runs.c.id).with_for_update(read=True)
    return {row.id: int(row.attempt) for row in await conn.execute(query)}


async def cancel_requested(conn: Connection, run_ids: list[UUID]) -> list[UUID]:
    """Which of these runs someone asked to cancel."""
    if not run_ids:
        return []
    query = sa.select(runs.c.id).where(
        runs.c.id.in_(run_ids), runs.c.cancel_requested_at.is_not(None)
    )
    return [row.id for row in await conn.execute(query)]


async def queued_backlog(conn: Connection, workspace_id: UUID, cap: int) -> int:
    """How many runs of the workspace wait in the queue, counted up to `cap` (bounded cost)."""
    waiting = (
        sa.select(runs.c.id)
        .where(runs.c.status == RunStatus.QUEUED.value, runs.c.workspace_id == workspace_id)
        .limit(cap)
        .subquery()
    )
    return int((await conn.execute(sa.select(sa.func.count()).select_from(waiting))).scalar_one())


async def reprioritise_queued(conn: Connection, task_id: UUID, priority: int) -> None:
    """Give a task's queued run its new priority."""
    await conn.execute(
        runs.update()
        .where(runs.c.task_id == task_id, runs.c.status == RunStatus.QUEUED.value)
        .values(priority=priority)
    )


async def request_cancel(conn: Connection, run_id: UUID, now: datetime) -> bool:
    """Ask the worker holding a running run to stop it; False if it is not running."""
    result = await conn.execute(
        runs.update()
        .where(runs.c.id == run_id, runs.c.status == RunStatus.RUNNING.value)
        .values(cancel_requested_at=now)
    )
    return int(result.rowcount) == 1


@dataclass(frozen=True, slots=True)
class Redelivery:
    """What happened to a delivery that ended without an outcome."""

    run_id: UUID
    task_id: UUID
    workspace_id: UUID
    status: RunStatus  # QUEUED (retried later), FAILED (dead-lettered) or CANCELLED
    error: str | None


async def expired(conn: Connection, *, now: datetime, limit: int = 500) -> list[Held]:
    """Deliveries whose lease ran out (PostgreSQL: locked; rows being changed are skipped)."""
    query = (
        sa.select(runs.c.id, runs.c.attempt)
        .where(runs.c.status == RunStatus.RUNNING.value, runs.c.lease_expires_at < now)
        .order_by(runs.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return [Held(row.id, int(row.attempt)) for row in await conn.execute(query)]


async def fail_deliveries(
    conn: Connection,
    held: list[Held],
    *,
    reason: str,
    now: datetime,
    policy: RetryPolicy | None = None,
) -> list[Redelivery]:
    """End deliveries that failed transiently: queue each again after a backoff, or, at the
    policy's maximum of failed attempts, dead-letter it (`failed`, with the reason kept).

    Fenced: a delivery whose attempt no longer holds the run is left alone.
    """
    policy = policy or RetryPolicy()
    out: list[Redelivery] = []
    for h in held:
        row = (
            await conn.execute(
                sa.select(
                    runs.c.task_id,
                    runs.c.workspace_id,
                    runs.c.failures,
                    runs.c.cancel_requested_at,
                ).where(
                    runs.c.id == h.run_id,
                    runs.c.attempt == h.attempt,
                    runs.c.status == RunStatus.RUNNING.value,
                )
            )
        ).first()
        if row is None:
            continue
        failures = int(row.failures) + 1
        values: dict[str, Any] = {
            "failures": failures,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        if row.cancel_requested_at is not None:
            status, error = RunStatus.CANCELLED, "cancelled on request"
        elif failures >= policy.max_attempts:
            status = RunStatus.FAILED
            error = f"dead-lettered after {failures} failed attempts; last: {reason}"
        else:
            status, error = RunStatus.QUEUED, None
            values["available_at"] = now + policy.delay(failures)
        if status is not RunStatus.QUEUED:
            values.update(finished_at=now, error=error)
        await conn.execute(
            runs.update()
            .where(runs.c.id == h.run_id, runs.c.attempt == h.attempt)
            .values(status=status.value, **values)
        )
        task_status = TaskStatus.QUEUED if status is RunStatus.QUEUED else TaskStatus(status.value)
        await conn.execute(
            tasks.update()
            .where(tasks.c.id == row.task_id, tasks.c.status == TaskStatus.RUNNING.value)
            .values(status=task_status.value, error=error, updated_at=now)
        )
        out.append(Redelivery(h.run_id, row.task_id, row.workspace_id, status, error))
    return out


async def release(conn: Connection, held: list[Held], *, now: datetime) -> int:
    """Give deliveries back to the queue unharmed (a draining worker); not a failure."""
    released = 0
    for h in held:
        result = await conn.execute(
            runs.update()
            .where(
                runs.c.id == h.run_id,
                runs.c.attempt == h.attempt,
                runs.c.status == RunStatus.RUNNING.value,
            )
            .values(
                status=RunStatus.QUEUED.value,
                lease_owner=None,
                lease_expires_at=None,
                available_at=None,
            )
            .returning(runs.c.task_id)
        )
        task_id = result.scalar_one_or_none()
        if task_id is None:
            continue
        released += 1
        await conn.execute(
            tasks.update()
            .where(tasks.c.id == task_id, tasks.c.status == TaskStatus.RUNNING.value)
            .values(status=TaskStatus.QUEUED.value, updated_at=now)
        )
    return released


async def finish(
    conn: Connection, *, run_id: UUID, attempt: int, outcome: RunOutcome, now: datetime
) -> bool:
    """Record a run's end and its task's, only if this attempt still holds it."""
    result = await conn.execute(
        runs.update()
        .where(
            runs.c.id == run_id,
            runs.c.attempt == attempt,
            runs.c.status == RunStatus.RUNNING.value,
        )
        .values(
            status=outcome.status.value,
            finished_at=now,
            first_token_at=outcome.first_token_at,
            ttft_ms=outcome.ttft_ms,
            provider=outcome.provider,
            model=outcome.model,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            error=outcome.error,
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(runs.c.task_id)
    )
    task_id = result.scalar_one_or_none()
    if task_id is None:
        return False
    await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id)
        .values(
            status=TaskStatus(outcome.status.value).value,
            result=outcome.result,
            error=outcome.error,
            updated_at=now,
        )
    )
    return True


async def get_run(conn: Connection, workspace_id: UUID, run_id: UUID) -> Any | None:
    """The run in this workspace, or None."""
    return (
        await conn.execute(
            sa.select(runs).where(runs.c.id == run_id, runs.c.workspace_id == workspace_id)
        )
    ).first()
