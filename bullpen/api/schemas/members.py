"""Wire schemas of /api/v1/members: a workspace's members and their roles."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bullpen.api.schemas.common import Strict, optional
from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import MemberRecord


class MemberUpdate(Strict):
    """Give a member another role, or mark it an approver (send only what changes)."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"role": "admin"}, {"approver": True}], "minProperties": 1}
    )

    role: Role = optional("Only an owner may grant `owner` or change an owner's role.")
    approver: bool = optional(
        "Whether the member may approve or deny approvals (owners and admins always may)."
    )

    @model_validator(mode="after")
    def _something(self) -> MemberUpdate:
        if not self.model_fields_set:
            raise ValueError("send `role`, `approver` or both")
        return self


class MemberPublic(BaseModel):
    """A user's membership of the workspace."""

    user_id: UUID
    email: str
    name: str
    role: Role
    approver: bool = Field(
        default=False, description="Marked an approver (owners and admins decide anyway)."
    )
    created_at: datetime = Field(description="When the user joined the workspace.")

    @classmethod
    def from_row(cls, row: MemberRecord) -> MemberPublic:
        """Build from a `memberships` row joined with its user."""
        return cls(
            user_id=row.user_id,
            email=row.email,
            name=row.name,
            role=Role(row.role),
            approver=row.approver,
            created_at=row.created_at,
        )


class MemberPage(BaseModel):
    """A page of members, oldest first; pass `next_cursor` as `cursor` for the next."""

    items: list[MemberPublic]
    next_cursor: str | None
