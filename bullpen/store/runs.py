"""Runs as the queue: claim with a lease, renew, re-queue expired, finish under a fence."""

from __future__ import annotations

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


async def claim(
    conn: Connection, *, owner: str, limit: int, now: datetime, lease: timedelta
) -> list[ClaimedRun]:
    """Take up to `limit` queued runs, oldest first, under a lease, with what running them needs."""
    # A materialized CTE: as a plain subquery PostgreSQL may re-run the LIMIT per row.
    candidates = (
        sa.select(runs.c.id)
        .where(runs.c.status == RunStatus.QUEUED.value)
        .order_by(runs.c.queued_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    claimed = list(
        await conn.execute(
            runs.update()
            .where(
                runs.c.id.in_(sa.select(candidates.c.id)),
                runs.c.status == RunStatus.QUEUED.value,
            )
            .values(
                status=RunStatus.RUNNING.value,
                attempt=runs.c.attempt + 1,
                lease_owner=owner,
                lease_expires_at=now + lease,
                started_at=now,
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
    return [
        ClaimedRun(
            id=row.id,
            task_id=row.task_id,
            workspace_id=row.workspace_id,
            agent_id=row.agent_id,
            attempt=row.attempt,
            prompt=row.prompt,
            agent_adapter=row.adapter,
            agent_config=dict(row.config),
        )
        for row in details
    ]


async def renew(
    conn: Connection, *, owner: str, run_ids: list[UUID], now: datetime, lease: timedelta
) -> None:
    """Extend the leases this worker still holds."""
    if not run_ids:
        return
    await conn.execute(
        runs.update()
        .where(
            runs.c.id.in_(run_ids),
            runs.c.lease_owner == owner,
            runs.c.status == RunStatus.RUNNING.value,
        )
        .values(lease_expires_at=now + lease)
    )


async def requeue_expired(conn: Connection, *, now: datetime) -> int:
    """Put runs whose lease ran out back in the queue; returns how many."""
    result = await conn.execute(
        runs.update()
        .where(runs.c.status == RunStatus.RUNNING.value, runs.c.lease_expires_at < now)
        .values(status=RunStatus.QUEUED.value, lease_owner=None, lease_expires_at=None)
    )
    return int(result.rowcount or 0)


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
