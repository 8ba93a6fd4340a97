"""The audit log: append-only, written in the transaction of the change it records."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.store.base import Connection
from bullpen.store.tables import audit_events


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
        audit_events.insert().values(
            id=uuid.uuid4(),
            workspace_id=workspace_id,
            actor_type=actor_type,
            actor_id=actor_id,
            action=action,
            target_type=target_type,
            target_id=target_id,
            data=data or {},
            created_at=now,
        )
    )
