"""Task trees and blockers: who waits for whom, waking a waiting task, and tool steps.

A task waits (`blocked`) while a child it waits for, or one of its blockers, has not ended.
When the last one ends, the transaction that ended it queues the waiting task again with a new
run, so the wake-up commits with the end that caused it and happens exactly once: the waiting
task's row is locked (PostgreSQL) before its open dependencies are counted, so two children
ending at once are serialised on it and the second sees the first's end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.records import OpenDescendant, TaskLink, TaskRecord
from bullpen.domain.status import TERMINAL_TASK, RunStatus, TaskStatus
from bullpen.errors import InvalidInput, NotFound
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection
from bullpen.store.tables import (
    agents,
    runs,
    task_blockers,
    task_comments,
    task_steps,
    tasks,
    workspaces,
)

_ENDED = sorted(status.value for status in TERMINAL_TASK)
MAX_BLOCKERS = 50


def _open_children(task_id: UUID) -> sa.Select[Any]:
    return (
        sa.select(sa.func.count())
        .select_from(tasks)
        .where(
            tasks.c.parent_id == task_id,
            tasks.c.blocks_parent.is_(True),
            tasks.c.status.not_in(_ENDED),
        )
    )


def _open_blockers(task_id: UUID) -> sa.Select[Any]:
    return (
        sa.select(sa.func.count())
        .select_from(task_blockers.join(tasks, tasks.c.id == task_blockers.c.blocker_id))
        .where(task_blockers.c.task_id == task_id, tasks.c.status.not_in(_ENDED))
    )


async def open_dependencies(conn: Connection, task_id: UUID) -> int:
    """Children the task waits for and blockers that have not ended."""
    children = (await conn.execute(_open_children(task_id))).scalar_one()
    blockers = (await conn.execute(_open_blockers(task_id))).scalar_one()
    return int(children) + int(blockers)


async def wake(conn: Connection, task_id: UUID, now: datetime) -> UUID | None:
    """Queue a blocked task whose dependencies have all ended; returns its new run's id."""
    query = sa.select(
        tasks.c.workspace_id, tasks.c.agent_id, tasks.c.priority, tasks.c.status
    ).where(tasks.c.id == task_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = (await conn.execute(query)).first()
    if row is None or row.status != TaskStatus.BLOCKED.value:
        return None
    if await open_dependencies(conn, task_id):
        return None
    await conn.execute(
        tasks.update()
        .where(tasks.c.id == task_id, tasks.c.status == TaskStatus.BLOCKED.value)
        .values(status=TaskStatus.QUEUED.value, updated_at=now)
    )
    run = await task_store.insert_run(
        conn, task_id, row.workspace_id, row.agent_id, now, priority=row.priority
    )
    return UUID(str(run.id))


async def ended(
    conn: Connection,
    *,
    parent_id: UUID | None,
    blocks_parent: bool,
    dependents: int,
    task_id: UUID,
    now: datetime,
) -> list[UUID]:
    """A task ended: wake its parent and the tasks it blocked that wait for nothing else.

    Returns the runs enqueued. Candidates are taken in id order, so two transactions waking
    overlapping sets lock them in the same order.
    """
    waiting: set[UUID] = set()
    if parent_id is not None and blocks_parent:
        waiting.add(parent_id)
    if dependents:
        rows = await conn.execute(
            sa.select(task_blockers.c.task_id).where(task_blockers.c.blocker_id == task_id)
        )
        waiting.update(row.task_id for row in rows)
    woken: list[UUID] = []
    for candidate in sorted(waiting):
        run_id = await wake(conn, candidate, now)
        if run_id is not None:
            woken.append(run_id)
    return woken


async def ended_task(conn: Connection, task_id: UUID, now: datetime) -> list[UUID]:
    """`ended` for a task known by id only (a cancel, a dead-letter)."""
    row = (
        await conn.execute(
            sa.select(tasks.c.parent_id, tasks.c.blocks_parent, tasks.c.dependents).where(
                tasks.c.id == task_id
            )
        )
    ).first()
    if row is None:
        return []
    return await ended(
        conn,
        parent_id=row.parent_id,
        blocks_parent=row.blocks_parent,
        dependents=row.dependents,
        task_id=task_id,
        now=now,
    )


async def add_blockers(
    conn: Connection, workspace_id: UUID, task_id: UUID, blocker_ids: list[UUID], now: datetime
) -> int:
    """Make `task_id` wait for each blocker of the same workspace; returns how many of them
    have not ended.

    Blockers are given when a task is created, so they cannot make a cycle (nothing waits for
    the new task yet).
    """
    wanted = list(dict.fromkeys(blocker_ids))
    if len(wanted) > MAX_BLOCKERS:
        raise InvalidInput(f"a task can have at most {MAX_BLOCKERS} blockers")
    if task_id in wanted:
        raise InvalidInput("a task cannot block itself")
    query = sa.select(tasks.c.id, tasks.c.status).where(
        tasks.c.id.in_(wanted), tasks.c.workspace_id == workspace_id
    )
    if conn.dialect.name == "postgresql":
        # A blocker ending concurrently waits for this transaction (and then sees the edge),
        # or has ended before these rows are read: either way the end is not missed.
        query = query.order_by(tasks.c.id).with_for_update(read=True)
    found = {row.id: row.status for row in await conn.execute(query)}
    missing = [str(b) for b in wanted if b not in found]
    if missing:
        raise NotFound(f"no such task in this workspace: {', '.join(missing)}")
    existing = {
        row.blocker_id
        for row in await conn.execute(
            sa.select(task_blockers.c.blocker_id).where(task_blockers.c.task_id == task_id)
        )
    }
    new = [b for b in wanted if b not in existing]
    if len(existing) + len(new) > MAX_BLOCKERS:
        raise InvalidInput(f"a task can have at most {MAX_BLOCKERS} blockers")
    if new:
        await conn.execute(
            task_blockers.insert(),
            [
                {
                    "task_id": task_id,
                    "blocker_id": b,
                    "workspace_id": workspace_id,
                    "created_at": now,
                }
                for b in new
            ],
        )
        await conn.execute(
            tasks.update()
            .where(tasks.c.id == task_id)
            .values(dependencies=tasks.c.dependencies + len(new))
        )
        await conn.execute(
            tasks.update().where(tasks.c.id.in_(new)).values(dependents=tasks.c.dependents + 1)
        )
    return sum(1 for b in wanted if found[b] not in _ENDED)


async def count_child(conn: Connection, parent_id: UUID) -> None:
    """A child the parent waits for was added (its end is then looked at)."""
    await conn.execute(
        tasks.update().where(tasks.c.id == parent_id).values(dependencies=tasks.c.dependencies + 1)
    )


async def depth_below_root(conn: Connection, task_id: UUID, cap: int) -> int:
    """How many levels `task_id` nests below its root task (0 for a root), counted up to `cap`
    + 1 at most: the walk up the tree stops there, however deep an older chain goes."""
    one: sa.ColumnElement[int] = sa.literal_column("1", sa.Integer)
    up = (
        sa.select(tasks.c.parent_id, sa.literal_column("0").label("depth"))
        .where(tasks.c.id == task_id)
        .cte("up", recursive=True)
    )
    up = up.union_all(
        sa.select(tasks.c.parent_id, up.c.depth + one).where(
            tasks.c.id == up.c.parent_id, up.c.depth <= cap
        )
    )
    depth = (await conn.execute(sa.select(sa.func.max(up.c.depth)))).scalar_one_or_none()
    return int(depth or 0)


async def open_descendants(
    conn: Connection, workspace_id: UUID, root_id: UUID, limit: int
) -> list[OpenDescendant]:
    """Up to `limit` descendants of `root_id` (not itself) that have not ended and are not
    already being stopped, shallowest first.

    One recursive query, whatever the tree's depth; it walks through ended tasks too, since a
    task that ended may have subtasks it did not wait for. A task whose running run was asked
    to stop is left to its worker, so a caller looping until this is empty ends.
    """
    one: sa.ColumnElement[int] = sa.literal_column("1", sa.Integer)
    down = (
        sa.select(tasks.c.id, sa.literal_column("0").label("depth"))
        .where(tasks.c.id == root_id, tasks.c.workspace_id == workspace_id)
        .cte("down", recursive=True)
    )
    down = down.union_all(
        sa.select(tasks.c.id, down.c.depth + one).where(tasks.c.parent_id == down.c.id)
    )
    stopping = sa.exists(
        sa.select(1).where(
            runs.c.task_id == tasks.c.id,
            runs.c.status == RunStatus.RUNNING.value,
            runs.c.cancel_requested_at.is_not(None),
        )
    )
    query = (
        sa.select(tasks.c.id, tasks.c.dependents)
        .select_from(down.join(tasks, tasks.c.id == down.c.id))
        .where(down.c.depth > 0, tasks.c.status.not_in(_ENDED), ~stopping)
        .order_by(down.c.depth, tasks.c.id)
        .limit(limit)
    )
    return [OpenDescendant.of(row._mapping) for row in await conn.execute(query)]


def _related_columns() -> list[Any]:
    return [
        tasks.c.id,
        tasks.c.number,
        workspaces.c.task_key,
        tasks.c.title,
        agents.c.name.label("agent"),
        tasks.c.status,
        tasks.c.result,
        tasks.c.error,
        tasks.c.blocks_parent,
    ]


def _related_from() -> Any:
    return tasks.join(workspaces, workspaces.c.id == tasks.c.workspace_id).join(
        agents, agents.c.id == tasks.c.agent_id
    )


async def children(conn: Connection, task_id: UUID) -> list[TaskLink]:
    """Every child of a task, oldest first, with its key and assignee's name."""
    rows = await conn.execute(
        sa.select(*_related_columns())
        .select_from(_related_from())
        .where(tasks.c.parent_id == task_id)
        .order_by(tasks.c.number)
    )
    return [TaskLink.of(row._mapping) for row in rows]


async def blockers(conn: Connection, task_id: UUID) -> list[TaskLink]:
    """Every blocker of a task, with its key and assignee's name."""
    rows = await conn.execute(
        sa.select(*_related_columns())
        .select_from(_related_from().join(task_blockers, task_blockers.c.blocker_id == tasks.c.id))
        .where(task_blockers.c.task_id == task_id)
        .order_by(tasks.c.number)
    )
    return [TaskLink.of(row._mapping) for row in rows]


async def child_by_origin(conn: Connection, parent_id: UUID, origin_key: str) -> TaskLink | None:
    """The subtask a tool step already created, if it did."""
    row = (
        await conn.execute(
            sa.select(*_related_columns())
            .select_from(_related_from())
            .where(tasks.c.parent_id == parent_id, tasks.c.origin_key == origin_key)
        )
    ).first()
    return None if row is None else TaskLink.of(row._mapping)


async def delegate(
    conn: Connection,
    *,
    workspace_id: UUID,
    parent_id: UUID,
    agent_id: UUID,
    title: str,
    prompt: str,
    priority: int,
    origin_key: str,
    wait: bool,
    now: datetime,
) -> tuple[TaskLink | TaskRecord, bool]:
    """Create the subtask of a tool step once; returns it and whether it was created now."""
    before = await child_by_origin(conn, parent_id, origin_key)
    if before is not None:
        return before, False
    task, _run = await task_store.insert_task_with_run(
        conn,
        workspace_id=workspace_id,
        agent_id=agent_id,
        title=title,
        prompt=prompt,
        now=now,
        priority=priority,
        parent_id=parent_id,
        origin_key=origin_key,
        blocks_parent=wait,
    )
    if wait:
        await count_child(conn, parent_id)
    return task, True


async def comment_once(
    conn: Connection,
    *,
    workspace_id: UUID,
    task_id: UUID,
    agent_id: UUID,
    body: str,
    origin_key: str,
    now: datetime,
) -> None:
    """Add an agent's comment of a tool step once."""
    found = (
        await conn.execute(
            sa.select(task_comments.c.id).where(
                task_comments.c.task_id == task_id, task_comments.c.origin_key == origin_key
            )
        )
    ).first()
    if found is None:
        await task_store.add_comment(
            conn,
            workspace_id=workspace_id,
            task_id=task_id,
            author_type="agent",
            author_id=agent_id,
            body=body,
            now=now,
            origin_key=origin_key,
        )


async def steps(conn: Connection, task_id: UUID) -> list[list[dict[str, Any]]]:
    """The stored tool steps of a task's `llm` agent, in order: each step's messages."""
    rows = await conn.execute(
        sa.select(task_steps.c.messages)
        .where(task_steps.c.task_id == task_id)
        .order_by(task_steps.c.step)
    )
    return [list(row.messages) for row in rows]


async def store_step(
    conn: Connection,
    *,
    task_id: UUID,
    step: int,
    run_id: UUID,
    messages: list[dict[str, Any]],
    cost_usd: float,
    now: datetime,
) -> None:
    """Record a completed tool step (its primary key refuses a second copy)."""
    await conn.execute(
        task_steps.insert().values(
            task_id=task_id,
            step=step,
            run_id=run_id,
            messages=messages,
            cost_usd=cost_usd,
            created_at=now,
        )
    )
    await conn.execute(
        tasks.update().where(tasks.c.id == task_id).values(steps=sa.func.max(tasks.c.steps, step))
        if conn.dialect.name == "sqlite"
        else tasks.update()
        .where(tasks.c.id == task_id)
        .values(steps=sa.func.greatest(tasks.c.steps, step))
    )
