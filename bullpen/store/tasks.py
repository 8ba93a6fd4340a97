"""Tasks and the first run each is enqueued with (one transaction, no dual write)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.status import RunStatus, TaskStatus
from bullpen.store.base import Connection
from bullpen.store.tables import runs, tasks, workspaces


@dataclass(frozen=True, slots=True)
class TaskPage:
    """One page of tasks, newest first, and where the next starts."""

    rows: list[Any]
    next_after: tuple[datetime, UUID] | None


_TASK_COLUMNS = [*tasks.c, workspaces.c.task_key]


async def next_task_number(conn: Connection, workspace_id: UUID) -> tuple[int, str]:
    """Reserve the workspace's next task number and return it with the workspace's task key."""
    row = (
        await conn.execute(
            workspaces.update()
            .where(workspaces.c.id == workspace_id)
            .values(task_counter=workspaces.c.task_counter + 1)
            .returning(workspaces.c.task_counter, workspaces.c.task_key)
        )
    ).one()
    return int(row.task_counter), str(row.task_key)


async def insert_task_with_run(
    conn: Connection,
    *,
    workspace_id: UUID,
    agent_id: UUID,
    title: str,
    prompt: str,
    creator_user_id: UUID | None,
    creator_key_id: UUID | None,
    now: datetime,
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """Create a queued task and its queued run; returns both as stored (no read-back)."""
    number, task_key = await next_task_number(conn, workspace_id)
    task = {
        "id": uuid.uuid4(),
        "workspace_id": workspace_id,
        "number": number,
        "title": title,
        "prompt": prompt,
        "agent_id": agent_id,
        "creator_user_id": creator_user_id,
        "creator_key_id": creator_key_id,
        "status": TaskStatus.QUEUED.value,
        "priority": 0,
        "result": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
    }
    run = {
        "id": uuid.uuid4(),
        "workspace_id": workspace_id,
        "task_id": task["id"],
        "agent_id": agent_id,
        "status": RunStatus.QUEUED.value,
        "attempt": 0,
        "queued_at": now,
    }
    await conn.execute(tasks.insert().values(**task))
    await conn.execute(runs.insert().values(**run))
    empty_run = {c.name: None for c in runs.c}
    return SimpleNamespace(**task, task_key=task_key), SimpleNamespace(**{**empty_run, **run})


async def get_task(conn: Connection, workspace_id: UUID, task_id: UUID) -> Any | None:
    """The task in this workspace, or None."""
    return (
        await conn.execute(
            sa.select(*_TASK_COLUMNS)
            .select_from(tasks.join(workspaces, workspaces.c.id == tasks.c.workspace_id))
            .where(tasks.c.id == task_id, tasks.c.workspace_id == workspace_id)
        )
    ).first()


async def list_tasks(
    conn: Connection,
    workspace_id: UUID,
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    status: str | None = None,
) -> TaskPage:
    """A page of the workspace's tasks, newest first, keyset-paginated on (created_at, id)."""
    query = (
        sa.select(*_TASK_COLUMNS)
        .select_from(tasks.join(workspaces, workspaces.c.id == tasks.c.workspace_id))
        .where(tasks.c.workspace_id == workspace_id)
        .order_by(tasks.c.created_at.desc(), tasks.c.id.desc())
        .limit(limit + 1)
    )
    if status is not None:
        query = query.where(tasks.c.status == status)
    if after is not None:
        created, last_id = after
        query = query.where(
            sa.or_(
                tasks.c.created_at < created,
                sa.and_(tasks.c.created_at == created, tasks.c.id < last_id),
            )
        )
    rows = list(await conn.execute(query))
    if len(rows) <= limit:
        return TaskPage(rows=rows, next_after=None)
    rows = rows[:limit]
    return TaskPage(rows=rows, next_after=(rows[-1].created_at, rows[-1].id))


async def runs_for_tasks(conn: Connection, task_ids: list[UUID]) -> dict[UUID, Any]:
    """The latest run of each given task, in one query."""
    if not task_ids:
        return {}
    result = await conn.execute(
        sa.select(runs).where(runs.c.task_id.in_(task_ids)).order_by(runs.c.queued_at)
    )
    return {row.task_id: row for row in result}
