"""Approvals: insert one (with its `approval.requested` notice), read, list, decide once, and
find the pending ones past their time."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.approvals import ApprovalKind, ApprovalRecord, ApprovalStatus
from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.domain.trace import TRACE_PARENT
from bullpen.store.base import Connection
from bullpen.store.ids import time_ordered_id
from bullpen.store.notices import add_notice
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import approvals, runs, tasks

_C = approvals.c


def notice_data(approval: ApprovalRecord) -> dict[str, Any]:
    """What the workspace stream tells of an approval (never its held messages)."""
    out: dict[str, Any] = {
        "approval_id": str(approval.id),
        "approval_kind": approval.kind,
        "status": approval.status,
        "task_id": str(approval.task_id),
        "agent_id": str(approval.agent_id),
    }
    if approval.kind == ApprovalKind.TOOL_CALL:
        out["tools"] = approval.subject.get("tools", [])
    if approval.status != ApprovalStatus.PENDING:
        out["approved"] = approval.approved
        out["reason"] = approval.reason
    return out


async def insert(
    conn: Connection,
    *,
    workspace_id: UUID,
    kind: ApprovalKind,
    task_id: UUID,
    agent_id: UUID,
    subject: dict[str, Any],
    default_outcome: str,
    now: datetime,
    ttl_s: int | None = None,
    run_id: UUID | None = None,
    step: int | None = None,
) -> ApprovalRecord:
    """Record a pending approval and its `approval.requested` notice; `ttl_s` None leaves its
    expiry to the setting (BULLPEN_APPROVAL_TTL_S)."""
    values: dict[str, Any] = {
        "id": time_ordered_id(),
        "workspace_id": workspace_id,
        "kind": kind.value,
        "status": ApprovalStatus.PENDING.value,
        "task_id": task_id,
        "agent_id": agent_id,
        "run_id": run_id,
        "step": step,
        "subject": subject,
        "default_outcome": default_outcome,
        "expires_at": None if ttl_s is None else now + timedelta(seconds=ttl_s),
        "reason": None,
        "decided_at": None,
        "decided_by_user_id": None,
        "decided_by_key_id": None,
        "created_at": now,
    }
    await conn.execute(approvals.insert().values(values))
    record = ApprovalRecord.of(values)
    await add_notice(conn, workspace_id, "approval.requested", notice_data(record), now)
    return record


async def get(conn: Connection, workspace_id: UUID, approval_id: UUID) -> ApprovalRecord | None:
    """The approval in this workspace, or None."""
    row = (
        await conn.execute(
            sa.select(approvals).where(_C.id == approval_id, _C.workspace_id == workspace_id)
        )
    ).first()
    return None if row is None else ApprovalRecord.of(row._mapping)


async def list_approvals(
    conn: Connection,
    workspace_id: UUID,
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    status: str | None = None,
) -> Page[ApprovalRecord]:
    """A page of the workspace's approvals, newest first, keyset-paginated on (created_at, id)."""
    query = sa.select(approvals).where(_C.workspace_id == workspace_id)
    if status is not None:
        query = query.where(_C.status == status)
    page = await keyset(
        conn, query, _C.created_at, _C.id, limit=limit, after=after, newest_first=True
    )
    return page.map(lambda row: ApprovalRecord.of(row._mapping))


async def decide(
    conn: Connection,
    approval_id: UUID,
    *,
    status: ApprovalStatus,
    reason: str | None,
    now: datetime,
    user_id: UUID | None = None,
    key_id: UUID | None = None,
) -> ApprovalRecord | None:
    """Decide a pending approval (None when it was decided already); records the
    `approval.decided` notice with it.

    On PostgreSQL its task's row is locked first, as the run that held the step locks it by
    ending. Without that, a decision made while that run was ending could miss it both ways:
    the decision's `release` found the task still `running`, and the run's end, reading
    before the decision committed, still saw the approval pending; the task then waited
    forever. Now one of them waits for the other and queues the task (see `release`)."""
    if conn.dialect.name == "postgresql":
        task_of = sa.select(_C.task_id).where(_C.id == approval_id).scalar_subquery()
        await conn.execute(sa.select(tasks.c.id).where(tasks.c.id == task_of).with_for_update())
    row = (
        await conn.execute(
            approvals.update()
            .where(_C.id == approval_id, _C.status == ApprovalStatus.PENDING.value)
            .values(
                status=status.value,
                reason=reason,
                decided_at=now,
                decided_by_user_id=user_id,
                decided_by_key_id=key_id,
            )
            .returning(*approvals.c)
        )
    ).first()
    if row is None:
        return None
    record = ApprovalRecord.of(row._mapping)
    await add_notice(conn, record.workspace_id, "approval.decided", notice_data(record), now)
    return record


async def expired(
    conn: Connection, now: datetime, default_ttl_s: float, limit: int
) -> list[ApprovalRecord]:
    """Up to `limit` pending approvals past their time, oldest first."""
    default_cutoff = now - timedelta(seconds=default_ttl_s)
    rows = await conn.execute(
        sa.select(approvals)
        .where(
            _C.status == ApprovalStatus.PENDING.value,
            sa.or_(
                _C.expires_at < now,
                sa.and_(_C.expires_at.is_(None), _C.created_at < default_cutoff),
            ),
        )
        .order_by(_C.created_at)
        .limit(limit)
    )
    return [ApprovalRecord.of(row._mapping) for row in rows]


async def held_step(conn: Connection, task_id: UUID, step: int) -> ApprovalRecord | None:
    """The approval holding the task's tool step `step`, pending or decided, if any."""
    row = (
        await conn.execute(
            sa.select(approvals)
            .where(
                _C.task_id == task_id,
                _C.kind == ApprovalKind.TOOL_CALL.value,
                _C.step == step,
            )
            .order_by(_C.created_at.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else ApprovalRecord.of(row._mapping)


async def pending_for(conn: Connection, task_id: UUID) -> bool:
    """Whether an approval of the task waits for a decision (at most one does)."""
    query = sa.select(_C.id).where(_C.task_id == task_id, _C.status == ApprovalStatus.PENDING.value)
    return (await conn.execute(query.limit(1))).first() is not None


async def release(conn: Connection, task_id: UUID, now: datetime) -> UUID | None:
    """Queue a task `awaiting_approval` again (with a new run; its id returned), only if it is
    still waiting: the guard re-checks under the row's lock on PostgreSQL, so a decision and
    the run that held the step, committing in either order, queue it exactly once."""
    row = (
        await conn.execute(
            tasks.update()
            .where(tasks.c.id == task_id, tasks.c.status == TaskStatus.AWAITING_APPROVAL.value)
            .values(status=TaskStatus.QUEUED.value, updated_at=now)
            .returning(tasks.c.workspace_id, tasks.c.agent_id, tasks.c.priority)
        )
    ).first()
    if row is None:
        return None
    run_id = time_ordered_id()
    await conn.execute(
        runs.insert().values(
            id=run_id,
            workspace_id=row.workspace_id,
            task_id=task_id,
            agent_id=row.agent_id,
            status=RunStatus.QUEUED.value,
            attempt=0,
            priority=row.priority,
            failures=0,
            queued_at=now,
            trace_parent=TRACE_PARENT.get(),  # the decision's request, while tracing
        )
    )
    return run_id


async def refuse(conn: Connection, task_id: UUID, error: str, now: datetime) -> bool:
    """Cancel a task still `awaiting_approval` with `error`; whether it was."""
    result = await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id, tasks.c.status == TaskStatus.AWAITING_APPROVAL.value)
        .values(status=TaskStatus.CANCELLED.value, error=error, updated_at=now)
    )
    return int(result.rowcount) == 1
