"""Wire schemas of /api/v1/users: accounts, passwords and the caller's own profile."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from bullpen.api.schemas.common import Strict, optional
from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import UserRecord

NAME_MAX = 200
EMAIL_MAX = 320
PASSWORD_MIN, PASSWORD_MAX = 12, 1024

# Printable text, no control characters, no surrounding whitespace. Refused rather than
# stripped, so that the OpenAPI pattern and the validation accept exactly the same strings.
TRIMMED_TEXT = r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f])?$"
# The WHATWG (HTML) email syntax; stored lowercased.
EMAIL = (
    r"^[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$"
)

Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=NAME_MAX, pattern=TRIMMED_TEXT, strict=True),
]
Email = Annotated[
    str, StringConstraints(min_length=3, max_length=EMAIL_MAX, pattern=EMAIL, strict=True)
]
Password = Annotated[
    str,
    StringConstraints(
        min_length=PASSWORD_MIN,
        max_length=PASSWORD_MAX,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        strict=True,
    ),
]


class UserCreate(Strict):
    """A new user; workspace admins then invite it (`POST /api/v1/invitations`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"email": "ada@example.com", "name": "Ada", "password": "correct horse battery"}
            ]
        }
    )

    email: Email = Field(description="Unique; stored lowercased.")
    name: Name
    password: Password = Field(description=f"{PASSWORD_MIN}–{PASSWORD_MAX} characters.")
    is_instance_admin: StrictBool = False


class UserUpdate(Strict):
    """Change a user (send only what changes; `null` is not a value)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"disabled": True}]})

    name: Name = optional()
    disabled: StrictBool = optional(
        "Disabling ends the user's sessions; its API keys stop working."
    )
    is_instance_admin: StrictBool = optional()


class PasswordChange(Strict):
    """Replace the caller's password; every session of the caller ends."""

    current_password: str = Field(min_length=1, max_length=PASSWORD_MAX, strict=True)
    new_password: Password


class UserPublic(BaseModel):
    """A user account (never its password or hash)."""

    id: UUID
    email: str
    name: str
    is_instance_admin: bool
    disabled: bool
    disabled_at: datetime | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: UserRecord) -> UserPublic:
        """Build from a `users` row (selected without its hash)."""
        return cls(
            id=row.id,
            email=row.email,
            name=row.name,
            is_instance_admin=bool(row.is_instance_admin),
            disabled=row.disabled_at is not None,
            disabled_at=row.disabled_at,
            created_at=row.created_at,
        )


class UserPage(BaseModel):
    """A page of users, oldest first; pass `next_cursor` as `cursor` for the next."""

    items: list[UserPublic]
    next_cursor: str | None


class MePublic(BaseModel):
    """The calling user, in the workspace it acts in now."""

    id: UUID
    email: str
    name: str
    is_instance_admin: bool
    role: Role
    workspace_id: UUID

    @classmethod
    def from_row(cls, row: UserRecord, role: Role, workspace_id: UUID) -> MePublic:
        """Build from a `users` row and the caller's current role and workspace."""
        return cls(
            id=row.id,
            email=row.email,
            name=row.name,
            is_instance_admin=bool(row.is_instance_admin),
            role=role,
            workspace_id=workspace_id,
        )
