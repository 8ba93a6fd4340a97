"""The workspace change log: every task's creation and status change, and the workspace's
notices (approvals, budgets, paused agents), in an order readers can follow without missing one.

Triggers on `tasks` (migration 0008) write a row in the transaction that made the change, so
every path (create, claim, finish, cancel, retry, wake) is covered and a rolled-back change
leaves nothing. Notices (`bullpen.store.notices`, migration 0013) are rows of the same log with
a `kind` and a JSON `data`, written in the caller's transaction: same order, same cursor.

The order is (xid, id), the cursor a reader resumes from. On SQLite one transaction writes at a
time, so ids are in commit order and xid is 0. On PostgreSQL ids are taken before commit and
transactions commit in any order, so a reader reading by id alone could pass a row that
commits later with a lower id. There `xid` is the writing transaction's id, and a reader takes
only rows whose transaction ended before the oldest one still running that could write them:
every row that can still appear sorts after them. PostgreSQL's snapshot lists the running
transactions of the whole server, so those known to belong to another database (by
`pg_stat_activity`) are left out: another database's open transaction never holds this one's
streams back. A write transaction left open in this database holds them back until it ends.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.store.base import Connection
from bullpen.store.tables import task_changes, tasks, workspaces

Cursor = tuple[int, int]  # (xid, id): a position in the change log
START: Cursor = (0, 0)  # before every change

_C = task_changes.c
# The oldest transaction still running, among those that may be this database's, or the
# snapshot's end when there is none (every id at or past it still counts as running). A backend
# never changes database, so an id `pg_stat_activity` shows in another one cannot write here,
# whenever that view was read; one it does not show stays counted. The activity view is read
# only when some transaction is running.
_SAFE_BELOW = sa.literal_column(
    """(SELECT coalesce(
        min(x::text::bigint), pg_snapshot_xmax(pg_current_snapshot())::text::bigint)
    FROM pg_snapshot_xip(pg_current_snapshot()) AS x
    WHERE x::xid NOT IN (
        SELECT backend_xid FROM pg_stat_activity
        WHERE datname <> current_database() AND backend_xid IS NOT NULL))""",
    sa.BigInteger,
)
_FIELDS = (
    _C.xid,
    _C.id,
    _C.task_id,
    _C.parent_id,
    _C.agent_id,
    _C.number,
    _C.status,
    _C.previous,
    _C.title,
    _C.at,
    _C.kind,
    _C.data,
)


@dataclass(frozen=True, slots=True)
class TaskChange:
    """One task's creation (`previous` is None) or status change."""

    cursor: Cursor
    task_id: UUID
    parent_id: UUID | None
    agent_id: UUID
    number: str  # as the API shows it: `<workspace task key>-<number>`
    status: str
    previous: str | None
    title: str | None
    at: datetime

    def data(self) -> dict[str, Any]:
        """The change as a stream event's data."""
        out: dict[str, Any] = {
            "task_id": str(self.task_id),
            "number": self.number,
            "parent_id": None if self.parent_id is None else str(self.parent_id),
            "agent_id": str(self.agent_id),
            "status": self.status,
            "previous": self.previous,
            "at": self.at.isoformat(),
        }
        if self.title is not None:
            out["title"] = self.title
        return out


@dataclass(frozen=True, slots=True)
class Notice:
    """One workspace event that is not a task's status change (`approval.requested`, ...)."""

    cursor: Cursor
    kind: str
    payload: dict[str, Any]
    at: datetime

    def data(self) -> dict[str, Any]:
        """The notice as a stream event's data: its payload with `kind` and `at`."""
        return {**self.payload, "kind": self.kind, "at": self.at.isoformat()}


Change = TaskChange | Notice


def _safe(conn: Connection) -> sa.ColumnElement[bool]:
    """Rows no transaction can still commit below (always true on SQLite)."""
    if conn.dialect.name == "postgresql":
        return _C.xid < _SAFE_BELOW
    return sa.true()


async def after(
    conn: Connection, workspace_id: UUID, cursor: Cursor, limit: int
) -> tuple[list[Change], bool]:
    """Up to `limit` changes and notices of the workspace after `cursor`, in order, and
    whether committed changes beyond them are held back for transactions still running
    (PostgreSQL)."""
    safe = _safe(conn).label("safe")
    rows = (
        await conn.execute(
            sa.select(*_FIELDS, workspaces.c.task_key, safe)
            .join(workspaces, workspaces.c.id == _C.workspace_id)
            .where(_C.workspace_id == workspace_id, sa.tuple_(_C.xid, _C.id) > sa.tuple_(*cursor))
            .order_by(_C.xid, _C.id)
            .limit(limit)
        )
    ).all()
    out = [_change(row) for row in rows if row.safe]
    return out, len(out) < len(rows)


async def head(conn: Connection, workspace_id: UUID) -> Cursor:
    """The position after the workspace's last change a reader can take now."""
    row = (
        await conn.execute(
            sa.select(_C.xid, _C.id)
            .where(_C.workspace_id == workspace_id, _safe(conn))
            .order_by(_C.xid.desc(), _C.id.desc())
            .limit(1)
        )
    ).first()
    return START if row is None else (int(row.xid), int(row.id))


async def first_of(conn: Connection, task_ids: Collection[UUID]) -> Cursor | None:
    """The position just before the earliest stored change of any of `task_ids`."""
    row = (
        await conn.execute(
            sa.select(_C.xid, _C.id)
            .where(_C.task_id.in_(task_ids))
            .order_by(_C.xid, _C.id)
            .limit(1)
        )
    ).first()
    return None if row is None else (int(row.xid), int(row.id) - 1)


async def last_of(conn: Connection, task_id: UUID) -> Cursor | None:
    """The position of the task's newest stored change."""
    row = (
        await conn.execute(
            sa.select(_C.xid, _C.id)
            .where(_C.task_id == task_id)
            .order_by(_C.xid.desc(), _C.id.desc())
            .limit(1)
        )
    ).first()
    return None if row is None else (int(row.xid), int(row.id))


async def subtree(conn: Connection, root_id: UUID) -> set[UUID]:
    """The task and all its descendants."""
    tree = sa.select(tasks.c.id).where(tasks.c.id == root_id).cte("tree", recursive=True)
    tree = tree.union_all(sa.select(tasks.c.id).where(tasks.c.parent_id == tree.c.id))
    return set((await conn.execute(sa.select(tree.c.id))).scalars())


async def delete_expired(conn: Connection, cutoff: datetime, limit: int) -> int:
    """Delete up to `limit` changes and notices made before `cutoff`; returns how many."""
    doomed = sa.select(_C.id).where(_C.at < cutoff).order_by(_C.at).limit(limit)
    result = await conn.execute(task_changes.delete().where(_C.id.in_(doomed)))
    return int(result.rowcount)


def _change(row: Any) -> Change:
    if row.kind is not None:
        return Notice(
            cursor=(int(row.xid), int(row.id)), kind=row.kind, payload=row.data or {}, at=row.at
        )
    return TaskChange(
        cursor=(int(row.xid), int(row.id)),
        task_id=row.task_id,
        parent_id=row.parent_id,
        agent_id=row.agent_id,
        number=f"{row.task_key}-{row.number}",
        status=row.status,
        previous=row.previous,
        title=row.title,
        at=row.at,
    )
