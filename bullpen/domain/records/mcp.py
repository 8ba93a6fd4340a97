"""Typed records of MCP servers, and of a tool step open while its outside calls run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self
from uuid import UUID

from bullpen.domain.records import pick


@dataclass(frozen=True, slots=True)
class McpServerRecord:
    """An MCP server as stored. `headers` maps each header name to its sealed value (base64)
    and hint, `{"sealed": …, "hint": …}`: opened by the worker only, never shown."""

    id: UUID
    workspace_id: UUID
    name: str
    transport: str  # http | stdio
    url: str | None
    headers: dict[str, dict[str, str]] = field(repr=False)
    command: list[str] | None
    env: dict[str, str]
    timeout_s: float
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        picked["headers"] = dict(picked["headers"] or {})
        picked["env"] = dict(picked["env"] or {})
        return cls(**picked)

    @property
    def header_hints(self) -> dict[str, str]:
        """What may be shown of the headers: each name and its value's hint."""
        return {name: str(value.get("hint", "…")) for name, value in self.headers.items()}


@dataclass(frozen=True, slots=True)
class OpenStep:
    """A tool step whose outside calls are running or were interrupted."""

    step: int
    messages: list[dict[str, Any]]
    calls: list[dict[str, str]]  # {"id", "name", "arguments"}
    results: dict[str, dict[str, Any]]  # call index -> {"state": started|done, "result"}
    cost_usd: float
