"""Retention: the oldest audit rows, usage ledger rows (with their rollups) and ended tasks,
deleted in batches.

Each function deletes at most `limit` rows in the caller's transaction and returns how many it
deleted; the housekeeping sweep calls them until a batch comes back short.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from bullpen.domain.status import TERMINAL_TASK, RunStatus
from bullpen.store import rollups
from bullpen.store.base import Connection
from bullpen.store.tables import (
    audit_events,
    cost_events,
    runs,
    task_blockers,
    tasks,
    ttft_hours,
)

# What the rollup needs of a deleted ledger row.
_ROLLED = (
    "workspace_id",
    "created_at",
    "agent_id",
    "api_key_id",
    "provider",
    "model",
    "source",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_usd",
)
_TERMINAL = sorted(s.value for s in TERMINAL_TASK)
_ACTIVE_RUN = (RunStatus.QUEUED.value, RunStatus.RUNNING.value)


async def delete_old_audit(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` audit events recorded before `cutoff`, oldest first."""
    c = audit_events.c
    doomed = sa.select(c.id).where(c.created_at < cutoff).order_by(c.created_at).limit(limit)
    result = await conn.execute(audit_events.delete().where(c.id.in_(doomed)))
    return int(result.rowcount)


async def delete_old_usage(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` usage ledger rows recorded before `cutoff`, oldest first, and take
    them out of the `cost_days` rollup (which so keeps what the ledger keeps, no more)."""
    c = cost_events.c
    doomed = sa.select(c.id).where(c.created_at < cutoff).order_by(c.created_at).limit(limit)
    result = await conn.execute(
        cost_events.delete().where(c.id.in_(doomed)).returning(*(c[name] for name in _ROLLED))
    )
    deleted = [dict(row._mapping) for row in result]
    await rollups.subtract_costs(conn, deleted)
    return len(deleted)


async def delete_old_ttft(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` rows of the `ttft_hours` histogram of hours that ended before
    `cutoff`, oldest first (it follows the usage ledger's retention, not the runs')."""
    h = ttft_hours.c
    doomed = (
        sa.select(h.workspace_id, h.hour, h.bucket)
        .where(h.hour <= cutoff - timedelta(hours=1))
        .order_by(h.hour)
        .limit(limit)
    )
    result = await conn.execute(
        ttft_hours.delete()
        .where(sa.tuple_(h.workspace_id, h.hour, h.bucket).in_(doomed))
        .returning(h.workspace_id, h.hour)
    )
    deleted = [(row.workspace_id, row.hour) for row in result]
    rollups.wrote_hours(conn, deleted)
    return len(deleted)


def _ended_before(table: sa.FromClause, cutoff: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.status.in_(_TERMINAL), table.c.updated_at < cutoff)


async def delete_ended_tasks(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` tasks that ended before `cutoff`, with their runs, comments and
    steps (by cascade); returns how many tasks.

    Only leaves go: a task with subtasks waits until they have gone, so a tree goes bottom up
    over successive batches and a live task is never deleted with its parent. A subtask stays
    while its parent is live or ended after `cutoff` (the tree goes whole), and so does a task
    that still blocks a live one, or one with a run still queued or running. The sweep deletes
    the ended runs' events first, in their own batches, so a task's cascade stays small.
    """
    t = tasks.alias("t")
    child = tasks.alias("child")
    parent = tasks.alias("parent")
    dependent = tasks.alias("dependent")
    b = task_blockers.c
    doomed = (
        sa.select(t.c.id)
        .where(
            t.c.created_at < cutoff,  # the index's range; the task's end is the test below
            _ended_before(t, cutoff),
            ~sa.exists().where(child.c.parent_id == t.c.id),
            sa.or_(
                t.c.parent_id.is_(None),
                sa.exists().where(parent.c.id == t.c.parent_id, _ended_before(parent, cutoff)),
            ),
            ~sa.exists().where(
                b.blocker_id == t.c.id,
                dependent.c.id == b.task_id,
                dependent.c.status.not_in(_TERMINAL),
            ),
            ~sa.exists().where(runs.c.task_id == t.c.id, runs.c.status.in_(_ACTIVE_RUN)),
        )
        .order_by(t.c.created_at)
        .limit(limit)
    )
    # The status test again on the row deleted: a task re-queued (retried) after the subquery
    # read it is rechecked by PostgreSQL under its row lock, and stays.
    result = await conn.execute(
        tasks.delete().where(tasks.c.id.in_(doomed), _ended_before(tasks, cutoff))
    )
    return int(result.rowcount)
