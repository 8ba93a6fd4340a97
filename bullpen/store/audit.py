"""The audit log: append-only, written in the transaction of the change it records."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.principal import NO_WORKSPACE, Principal
from bullpen.domain.records.audit import AuditEventRecord
from bullpen.store.base import Connection
from bullpen.store.ids import time_ordered_id
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import audit_events

_INSERT = audit_events.insert()


async def record(
    conn: Connection,
    *,
    workspace_id: UUID | None,
    actor_type: str,
    actor_id: UUID | None,
    action: str,
    target_type: str,
    target_id: UUID | None,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> None:
    """Append one audit event; the caller's transaction commits it with the change."""
    await conn.execute(
        _INSERT,
        {
            "id": time_ordered_id(),
            "workspace_id": workspace_id,
            "actor_type": actor_type,
            "actor_id": actor_id,
            "action": action,
            "target_type": target_type,
            "target_id": target_id,
            "data": data or {},
            "created_at": now,
        },
    )


def entry_by(
    principal: Principal,
    action: str,
    target_type: str,
    target_id: UUID | None,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The row of an audit event whose actor is the caller, in its workspace (if it has one),
    for a statement that inserts it with the change it records (see tasks.insert_task_with_run)."""
    return {
        "id": time_ordered_id(),
        "workspace_id": None if principal.workspace_id == NO_WORKSPACE else principal.workspace_id,
        "actor_type": principal.actor_type,
        "actor_id": principal.actor_id,
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "data": data or {},
        "created_at": now,
    }


async def insert(conn: Connection, entry: dict[str, Any]) -> None:
    """Append one audit event given as a row (`entry_by`)."""
    await conn.execute(_INSERT, entry)


async def record_by(
    conn: Connection,
    principal: Principal,
    action: str,
    target_type: str,
    target_id: UUID | None,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> None:
    """Append an audit event whose actor is the caller, in its workspace (if it has one)."""
    workspace_id = None if principal.workspace_id == NO_WORKSPACE else principal.workspace_id
    await _record_as(conn, principal, workspace_id, action, target_type, target_id, now, data)


async def record_instance(
    conn: Connection,
    principal: Principal,
    action: str,
    target_type: str,
    target_id: UUID | None,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> None:
    """Append an instance-level audit event (no workspace): an instance admin's action."""
    await _record_as(conn, principal, None, action, target_type, target_id, now, data)


async def _record_as(
    conn: Connection,
    principal: Principal,
    workspace_id: UUID | None,
    action: str,
    target_type: str,
    target_id: UUID | None,
    now: datetime,
    data: dict[str, Any] | None,
) -> None:
    await record(
        conn,
        workspace_id=workspace_id,
        actor_type=principal.actor_type,
        actor_id=principal.actor_id,
        action=action,
        target_type=target_type,
        target_id=target_id,
        now=now,
        data=data,
    )


async def list_events(
    conn: Connection,
    workspace_id: UUID | None,
    *,
    limit: int,
    after: tuple[datetime, UUID] | None,
    action: str | None = None,
    target_id: UUID | None = None,
    actor_id: UUID | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Page[AuditEventRecord]:
    """A page of the workspace's audit events (None: the instance's), newest first; `since`
    inclusive, `until` exclusive."""
    c = audit_events.c
    scope = c.workspace_id.is_(None) if workspace_id is None else c.workspace_id == workspace_id
    query = sa.select(audit_events).where(scope)
    if action is not None:
        query = query.where(c.action == action)
    if target_id is not None:
        query = query.where(c.target_id == target_id)
    if actor_id is not None:
        query = query.where(c.actor_id == actor_id)
    if since is not None:
        query = query.where(c.created_at >= since)
    if until is not None:
        query = query.where(c.created_at < until)
    page = await keyset(
        conn, query, c.created_at, c.id, limit=limit, after=after, newest_first=True
    )
    return page.map(lambda row: AuditEventRecord.of(row._mapping))
