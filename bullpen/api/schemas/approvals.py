"""Wire schemas of /api/v1/approvals: an approval, a page of them, and a decision."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from bullpen.api.schemas.budgets import Amount
from bullpen.api.schemas.common import Strict
from bullpen.domain.approvals import REASON_MAX, ApprovalKind, ApprovalRecord

NO_NUL = r"^[^\x00]*$"
_CALL_ARGS_MAX = 2000  # characters of a held tool call's arguments shown


class ApprovalDecision(Strict):
    """A decision: optionally why (the denied task's error, or what the model is told)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"reason": "Not this quarter."}]}
    )

    reason: Annotated[str, Field(max_length=REASON_MAX, pattern=NO_NUL)] | None = Field(
        default=None, description=f"Why (at most {REASON_MAX} characters)."
    )


class ApprovalApproval(ApprovalDecision):
    """An approval: optionally why; a budget override's amount."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"reason": "Worth it.", "amount_usd": 2.5}]},
    )

    amount_usd: Amount | None = Field(
        default=None,
        description="`budget_override` only, and needed there: how much more (USD) the task's "
        "runs may spend past their budgets, once. Any other kind refuses it (422).",
    )


class HeldCall(BaseModel):
    """A tool call held for the approval."""

    id: str
    name: str
    arguments: str = Field(description=f"As the model wrote them (first {_CALL_ARGS_MAX} chars).")


class ApprovalPublic(BaseModel):
    """An approval as the API shows it."""

    id: UUID
    kind: str = Field(
        examples=["task"],
        description="`task` (a new task waits before it is queued), `tool_call` (a tool step "
        "waits before its gated tools run) or `budget_override`.",
    )
    status: str = Field(
        examples=["pending"], description="`pending`, `approved`, `denied` or `expired`."
    )
    approved: bool | None = Field(
        description="The decision's effect (an expired approval's is its default outcome); "
        "`null` while pending."
    )
    task_id: UUID
    agent_id: UUID
    run_id: UUID | None = Field(description="The run that asked (a tool call's).")
    step: int | None = Field(description="The tool step held (a tool call's).")
    tools: list[str] = Field(description="The gated tools the held step calls.")
    calls: list[HeldCall] = Field(description="Every call of the held step.")
    default_outcome: str = Field(description="What expiry decides: `approve` or `deny`.")
    expires_at: datetime = Field(description="When it expires if still undecided.")
    reason: str | None
    decided_at: datetime | None
    decided_by: UUID | None = Field(description="The user or API key that decided.")
    created_at: datetime

    @classmethod
    def from_row(cls, row: ApprovalRecord, default_ttl_s: float) -> ApprovalPublic:
        """Build from a stored approval (its held messages are never shown)."""
        subject: dict[str, Any] = row.subject
        calls = subject.get("calls", []) if row.kind == ApprovalKind.TOOL_CALL else []
        return cls(
            id=row.id,
            kind=row.kind,
            status=row.status,
            approved=row.approved,
            task_id=row.task_id,
            agent_id=row.agent_id,
            run_id=row.run_id,
            step=row.step,
            tools=list(subject.get("tools", [])),
            calls=[
                HeldCall(id=c["id"], name=c["name"], arguments=c["arguments"][:_CALL_ARGS_MAX])
                for c in calls
            ],
            default_outcome=row.default_outcome,
            expires_at=row.expiry(default_ttl_s),
            reason=row.reason,
            decided_at=row.decided_at,
            decided_by=row.decided_by_key_id or row.decided_by_user_id,
            created_at=row.created_at,
        )


class ApprovalPage(BaseModel):
    """A page of approvals, newest first; pass `next_cursor` as `cursor` for the next."""

    items: list[ApprovalPublic]
    next_cursor: str | None
