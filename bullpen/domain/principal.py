"""Who is calling: resolved once per request from an API key or a session."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from bullpen.domain.access import Permission


#: The workspace of a signed-in user who belongs to none yet (it may accept an invitation):
#: no workspace has this id, and such a caller holds no permission.
NO_WORKSPACE = UUID(int=0)


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
    permissions: frozenset[Permission] = field(default_factory=frozenset)
    agent_id: UUID | None = None
    is_instance_admin: bool = False
    # The relay limits of the API key it called with (None: no limit, or not a key).
    rpm_limit: int | None = None
    tpm_limit: int | None = None

    @property
    def actor_type(self) -> str:
        """How audit events name this caller."""
        return "api_key" if self.api_key_id is not None else "user"

    @property
    def actor_id(self) -> UUID | None:
        """The id audit events record."""
        return self.api_key_id if self.api_key_id is not None else self.user_id

    @property
    def scope_id(self) -> str:
        """The caller as one string (idempotency scopes, rate-limit buckets)."""
        if self.api_key_id is not None:
            return f"key:{self.api_key_id}"
        return f"user:{self.user_id}"

    def can(self, permission: Permission) -> bool:
        """Whether this caller holds `permission` in its workspace."""
        return permission in self.permissions
