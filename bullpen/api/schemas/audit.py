"""Wire schemas of /api/v1/audit: audited changes."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field

from bullpen.domain.records.audit import AuditEventRecord


class AuditEventPublic(BaseModel):
    """One audited change (or refused attempt)."""

    id: UUID
    actor_type: str
    actor_id: UUID | None
    action: str = Field(examples=["task.create"])
    target_type: str
    target_id: UUID | None
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: AuditEventRecord) -> AuditEventPublic:
        """Build from an `audit_events` row."""
        return cls(
            id=row.id,
            actor_type=row.actor_type,
            actor_id=row.actor_id,
            action=row.action,
            target_type=row.target_type,
            target_id=row.target_id,
            data=dict(row.data),
            created_at=row.created_at,
        )


class AuditPage(BaseModel):
    """A page of audit events, newest first."""

    items: list[AuditEventPublic]
    next_cursor: str | None
