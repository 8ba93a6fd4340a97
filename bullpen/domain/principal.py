"""Who is calling: resolved once per request from an API key or a session."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID


class Role(StrEnum):
    """A member's role in a workspace."""

    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller, always bound to one workspace."""

    workspace_id: UUID
    user_id: UUID | None
    api_key_id: UUID | None
    role: Role
    via: str  # "api_key" or "session"

    @property
    def actor_type(self) -> str:
        """How audit events name this caller."""
        return "api_key" if self.api_key_id is not None else "user"

    @property
    def actor_id(self) -> UUID | None:
        """The id audit events record."""
        return self.api_key_id if self.api_key_id is not None else self.user_id

    @property
    def can_write(self) -> bool:
        """Viewers read; everyone else may create and change tasks."""
        return self.role is not Role.VIEWER
