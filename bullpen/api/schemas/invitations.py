"""Wire schemas of invitations to a workspace."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from bullpen.api.schemas.common import Strict
from bullpen.api.schemas.users import Email
from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import InvitationRecord


class InvitationCreate(Strict):
    """Invite an email to the workspace with a role."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"email": "ada@example.com", "role": "member"}]}
    )

    email: Email = Field(description="Whoever signs in with this email (any case) may accept.")
    role: Role = Field(description="Only an owner may invite as `owner`.")


class InvitationPublic(BaseModel):
    """A pending invitation to a workspace."""

    id: UUID
    workspace_id: UUID
    workspace_name: str
    email: str
    role: Role
    created_at: datetime
    expires_at: datetime = Field(description="After this it can no longer be accepted.")

    @classmethod
    def from_row(cls, row: InvitationRecord) -> InvitationPublic:
        """Build from an `invitations` row joined with its workspace."""
        return cls(
            id=row.id,
            workspace_id=row.workspace_id,
            workspace_name=row.workspace_name,
            email=row.email,
            role=Role(row.role),
            created_at=row.created_at,
            expires_at=row.expires_at,
        )


class InvitationList(BaseModel):
    """Pending invitations, newest first (at most 200)."""

    items: list[InvitationPublic]
