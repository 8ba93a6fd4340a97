"""Wire schemas of /api/v1/api-keys: scoped API keys."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_validator,
)

from bullpen.api.schemas.common import Strict, integral
from bullpen.domain.access import ALL_SCOPES, Permission
from bullpen.domain.records.accounts import ApiKeyRecord
from bullpen.services.api_keys import LIMIT_MAX, LIST_MAX

# Printable, no control characters, no leading or trailing whitespace.
_NAME = r"^[^\x00-\x20\x7f]([^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"
KeyName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_NAME)]
# Either permissions, or `["*"]` alone: the schema itself says `*` combines with nothing.
Permissions = Annotated[list[Permission], Field(min_length=1, max_length=len(Permission))]
Everything = Annotated[list[Literal["*"]], Field(min_length=1, max_length=1)]
_EVERYTHING: list[Literal["*"]] = ["*"]


def _scope_kind(value: Any) -> str:
    return "everything" if isinstance(value, list) and ALL_SCOPES in value else "permissions"


PerMinute = Annotated[int, Field(ge=1, le=LIMIT_MAX, strict=True), BeforeValidator(integral)]
_RPM = (
    "Relay (`/v1/chat/completions`) requests per minute of this key; beyond, 429 "
    "`rate_limit_exceeded` with `Retry-After`. `null`: no limit."
)
_TPM = (
    "Relay tokens per minute of this key: input + output tokens of its calls that ended in "
    "the last minute, plus the prompt estimates of those in flight; a call that would pass it "
    "gets 429 `rate_limit_exceeded` with `Retry-After`. `null`: no limit."
)

Scopes = Annotated[
    Annotated[Permissions, Tag("permissions")] | Annotated[Everything, Tag("everything")],
    Discriminator(_scope_kind),
]


class ApiKeyCreate(Strict):
    """A new API key for the caller or, with `keys:admin`, for one of the workspace's agents."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "ci pipeline", "scopes": ["tasks:read", "tasks:write"]},
                {"name": "laptop"},
            ]
        },
    )

    name: KeyName = Field(description="What the key is for (1–100 characters).")
    scopes: Scopes = Field(
        default=_EVERYTHING,
        description=(
            'What the key may do: permissions, or `["*"]` for everything its owner may do '
            "(the owner's current role, or an agent's grant). A key never grants more than its "
            "creator holds: asking for more is 403."
        ),
    )
    expires_at: AwareDatetime | None = Field(
        default=None,
        description="When the key stops working: in the future, at most 366 days ahead. "
        "Omit for a key that does not expire.",
    )
    agent_id: UUID | None = Field(
        default=None,
        description="Create the key for this agent of the workspace (needs `keys:admin`).",
    )
    workspace_id: UUID | None = Field(
        default=None,
        description=(
            "The workspace the key acts in: by default the caller's current one; another "
            "workspace the calling user belongs to gives a key with the user's role there "
            "(not for agents' keys; the caller must be a session or an unscoped key). A "
            "workspace the user is not a member of is 404."
        ),
    )

    rpm_limit: PerMinute | None = Field(default=None, description=_RPM)
    tpm_limit: PerMinute | None = Field(default=None, description=_TPM)

    @field_validator("scopes")
    @classmethod
    def _unique(cls, value: list[Any]) -> list[Any]:
        return list(dict.fromkeys(value))


class ApiKeyUpdate(Strict):
    """Change a key's relay limits (send only what changes; `null` removes a limit)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"rpm_limit": 60, "tpm_limit": 100_000}]},
    )

    rpm_limit: PerMinute | None = Field(default=None, description=_RPM)
    tpm_limit: PerMinute | None = Field(default=None, description=_TPM)


class ApiKeyPublic(BaseModel):
    """An API key as listed: never the key itself, only its visible prefix."""

    id: UUID
    name: str
    prefix: str = Field(
        examples=["bp_AbCdEfGh"], description="The key's first characters, to tell keys apart."
    )
    scopes: list[str] = Field(examples=[["*"], ["tasks:read"]])
    workspace_id: UUID = Field(description="The workspace the key acts in (fixed).")
    user_id: UUID | None = Field(description="The user the key acts as (null for an agent's).")
    agent_id: UUID | None = Field(description="The agent the key acts as (null for a user's).")
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None = Field(description="Last use, to about a minute.")
    revoked_at: datetime | None
    rpm_limit: int | None = Field(description="Relay requests per minute; `null`: no limit.")
    tpm_limit: int | None = Field(description="Relay tokens per minute; `null`: no limit.")

    @classmethod
    def from_row(cls, row: ApiKeyRecord) -> ApiKeyPublic:
        """Build from an `api_keys` row (without its digest)."""
        return cls(
            id=row.id,
            name=row.name,
            prefix=row.prefix,
            scopes=list(row.scopes),
            workspace_id=row.workspace_id,
            user_id=row.user_id,
            agent_id=row.agent_id,
            created_at=row.created_at,
            expires_at=row.expires_at,
            last_used_at=row.last_used_at,
            revoked_at=row.revoked_at,
            rpm_limit=row.rpm_limit,
            tpm_limit=row.tpm_limit,
        )


class ApiKeyCreated(ApiKeyPublic):
    """A new API key, with the key itself shown this once."""

    key: str | None = Field(
        description=(
            "The full key (`bp_…`), shown only in this response: store it now. It is never "
            "stored, so a replay of this request (same `Idempotency-Key`) returns `null`; if "
            "the first response was lost, revoke the key and create another."
        ),
    )


class ApiKeyList(BaseModel):
    """API keys, newest first."""

    items: list[ApiKeyPublic] = Field(description=f"At most the {LIST_MAX} newest keys.")
