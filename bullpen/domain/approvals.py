"""Approvals: the gates a person decides (human in the loop), their kinds and their states.

A `task` approval holds a new task of an agent that requires approval before it is queued;
a `tool_call` approval holds an `llm` agent's tool step before its gated tools run (the step's
messages are kept, so the next run resumes there without asking the model again); a
`budget_override` (reserved for budgets) resumes a run a budget stopped with a one-off amount.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Self
from uuid import UUID

from bullpen.domain.records import pick

TTL_MIN_S, TTL_MAX_S = 1, 30 * 86_400  # an approval's time to live, per agent or setting
REASON_MAX = 2000  # characters of a decision's reason


class ApprovalKind(StrEnum):
    """What an approval holds."""

    TASK = "task"
    TOOL_CALL = "tool_call"
    BUDGET_OVERRIDE = "budget_override"


class ApprovalStatus(StrEnum):
    """Where an approval is: waiting, or decided by a person or by its expiry."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"  # decided by its `default_outcome`


class Outcome(StrEnum):
    """A decision."""

    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """An approval as stored."""

    id: UUID
    workspace_id: UUID
    kind: str
    status: str
    task_id: UUID
    agent_id: UUID
    run_id: UUID | None
    step: int | None
    subject: dict[str, Any]
    default_outcome: str
    expires_at: datetime | None
    reason: str | None
    decided_at: datetime | None
    decided_by_user_id: UUID | None
    decided_by_key_id: UUID | None
    created_at: datetime

    @classmethod
    def of(cls, values: Any) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))

    def expiry(self, default_ttl_s: float) -> datetime:
        """When it expires undecided (its own time, else `default_ttl_s` after creation)."""
        if self.expires_at is not None:
            return self.expires_at
        return self.created_at + timedelta(seconds=default_ttl_s)

    @property
    def approved(self) -> bool | None:
        """The decision's effect: approved (by a person or by expiry), denied, or None."""
        if self.status == ApprovalStatus.APPROVED:
            return True
        if self.status == ApprovalStatus.DENIED:
            return False
        if self.status == ApprovalStatus.EXPIRED:
            return self.default_outcome == Outcome.APPROVE
        return None
