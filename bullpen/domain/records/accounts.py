"""Typed records of accounts: users, workspaces, members, API keys and invitations.

Secrets stay where the store put them: a user record never holds a password hash (only the
sign-in lookup, `UserLogin`, does) and an API key record never holds the key's digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self
from uuid import UUID

from bullpen.domain.principal import Role
from bullpen.domain.records import pick


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user as admins see it (no password hash)."""

    id: UUID
    email: str
    name: str
    is_instance_admin: bool
    disabled_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["is_instance_admin"] = bool(picked["is_instance_admin"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class UserLogin:
    """What signing in checks: an enabled user's id and password hash."""

    id: UUID
    password_hash: str = field(repr=False)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class WorkspaceRecord:
    """A workspace as stored."""

    id: UUID
    name: str
    slug: str
    task_key: str
    task_counter: int
    created_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A membership of a workspace, with the member's email and name."""

    user_id: UUID
    email: str
    name: str
    role: Role
    created_at: datetime
    approver: bool = False  # may decide approvals (owners and admins always may)
    disabled_at: datetime | None = None  # the user's account is disabled (instance-wide)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["role"] = Role(picked["role"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class MembershipRecord:
    """A workspace a user belongs to (`id` is the workspace's), with the role held there."""

    id: UUID
    name: str
    slug: str
    task_key: str
    role: Role

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["role"] = Role(picked["role"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """An API key as its owner and admins see it (never its digest)."""

    id: UUID
    workspace_id: UUID
    user_id: UUID | None
    agent_id: UUID | None
    name: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    rpm_limit: int | None  # relay requests per minute (None: no limit)
    tpm_limit: int | None  # relay tokens per minute (None: no limit)

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["scopes"] = list(picked["scopes"])
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class RevokedKey:
    """A key just revoked: enough to name it in an audit event."""

    id: UUID
    name: str
    prefix: str

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))


@dataclass(frozen=True, slots=True)
class InvitationRecord:
    """A pending invitation; the workspace's name and slug when read with its workspace."""

    id: UUID
    workspace_id: UUID
    email: str
    role: Role
    invited_by_type: str
    invited_by_id: UUID | None
    created_at: datetime
    expires_at: datetime
    workspace_name: str | None = None
    workspace_slug: str | None = None

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping (with or without the workspace's columns)."""
        picked = pick(cls, {**dict.fromkeys(_JOINED), **values})
        picked["role"] = Role(picked["role"])
        return cls(**picked)


_JOINED = ("workspace_name", "workspace_slug")
