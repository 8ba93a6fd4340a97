"""Workspace notices: events other than task status changes (`approval.requested`,
`approval.decided`, `budget.warning`, `budget.exceeded`, `agent.paused`, ...) on the workspace
stream.

A notice is a row of the change log (`bullpen.store.changes`) with a `kind` and a JSON `data`,
written in the caller's open transaction: it shares the log's (xid, id) order and cursor with
task changes, appears only if that transaction commits, and is pruned with them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.store.base import Connection
from bullpen.store.tables import task_changes

KIND_MAX = 40  # characters of a notice's kind (the column's width)
# The writing transaction's id, as the triggers of migration 0008 take it (see changes.py).
_PG_XID = sa.text("pg_current_xact_id()::text::bigint")


async def add_notice(
    conn: Connection, workspace_id: UUID, kind: str, data: dict[str, Any], now: datetime
) -> None:
    """Record a notice of `kind` for the workspace in the caller's transaction; its stream
    frame is `event: <kind>` with `data` plus `kind` and `at`. `data` must be JSON and carry
    no secret."""
    if not 0 < len(kind) <= KIND_MAX or kind == "task":
        raise ValueError(f"bad notice kind {kind!r}")
    xid: Any = _PG_XID if conn.dialect.name == "postgresql" else 0
    await conn.execute(
        task_changes.insert().values(
            xid=xid, workspace_id=workspace_id, kind=kind, data=data, at=now
        )
    )
