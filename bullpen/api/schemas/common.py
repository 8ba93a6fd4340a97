"""Wire schemas shared by every resource: request-body strictness, PATCH fields, problems."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def integral(value: Any) -> Any:
    """JSON Schema counts 5.0 as an integer; strings and booleans stay refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class Strict(BaseModel):
    """Request bodies: unknown fields are refused (no mass assignment)."""

    model_config = ConfigDict(extra="forbid")


def optional(description: str | None = None) -> Any:
    """A PATCH field: may be left out, but `null` is refused (422) and not documented.

    The field's type stays non-nullable; only the unvalidated default is None, so
    `model_dump(exclude_unset=True)` holds exactly the fields sent.
    """
    return Field(default=None, description=description, json_schema_extra=_no_default)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
