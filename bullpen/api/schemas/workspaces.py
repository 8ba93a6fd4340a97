"""Wire schemas of /api/v1/workspaces and /api/v1/session: workspaces, memberships."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from bullpen.api.schemas.common import Strict, optional
from bullpen.api.schemas.users import Name
from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import WorkspaceRecord
from bullpen.services.workspaces import Membership

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{1,62}$", strict=True)]
TaskKey = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9]{0,9}$", strict=True)]


class WorkspaceCreate(Strict):
    """A new workspace; its creator becomes its owner."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "Research", "slug": "research", "task_key": "RS"}]}
    )

    name: Name
    slug: Slug = Field(description="Unique across the instance: 2–63 of `a-z`, `0-9`, `-`.")
    task_key: TaskKey = Field(description="Prefix of task numbers (`RS-42`).")


class WorkspaceUpdate(Strict):
    """Rename the workspace."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "Research (EU)"}]})

    name: Name = optional()


class WorkspacePublic(BaseModel):
    """A workspace (tenant)."""

    id: UUID
    name: str
    slug: str
    task_key: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: WorkspaceRecord) -> WorkspacePublic:
        """Build from a `workspaces` row."""
        return cls(
            id=row.id,
            name=row.name,
            slug=row.slug,
            task_key=row.task_key,
            created_at=row.created_at,
        )


class WorkspaceMembership(BaseModel):
    """A workspace the caller belongs to, with its role there."""

    id: UUID
    name: str
    slug: str
    task_key: str
    role: Role
    current: bool = Field(description="Whether the caller acts in this workspace now.")

    @classmethod
    def from_membership(cls, entry: Membership) -> WorkspaceMembership:
        """Build from the service's membership entry."""
        return cls(
            id=entry.id,
            name=entry.name,
            slug=entry.slug,
            task_key=entry.task_key,
            role=entry.role,
            current=entry.current,
        )


class WorkspaceList(BaseModel):
    """The caller's workspaces, oldest membership first."""

    items: list[WorkspaceMembership]


class WorkspaceSwitch(Strict):
    """The workspace to act in from now on."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"workspace_id": "0b6a9f3e-9d53-4c5e-9f1e-3f4d3c2b1a00"}]}
    )

    workspace_id: UUID = Field(description="A workspace the calling user belongs to.")
