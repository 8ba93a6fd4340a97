"""Typed records of the audit log and of stored idempotent outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self
from uuid import UUID

from bullpen.domain.records import pick


@dataclass(frozen=True, slots=True)
class AuditEventRecord:
    """Who did what to which target, when (no workspace: an instance-level event)."""

    id: UUID
    workspace_id: UUID | None
    actor_type: str
    actor_id: UUID | None
    action: str
    target_type: str
    target_id: UUID | None
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """The stored outcome of a create under one idempotency key, replayed on a retry."""

    workspace_id: UUID
    principal: str
    route: str
    key: str
    fingerprint: bytes
    status_code: int
    headers: dict[str, str]
    body: bytes = field(repr=False)
    created_at: datetime
    expires_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["fingerprint"] = bytes(picked["fingerprint"])
        picked["body"] = bytes(picked["body"])
        return cls(**picked)
