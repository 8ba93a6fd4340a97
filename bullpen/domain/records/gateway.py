"""Typed records of the gateway's configuration: providers and model routes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Self
from uuid import UUID

from bullpen.domain.records import pick


@dataclass(frozen=True, slots=True)
class ProviderRecord:
    """A provider as stored; its API key only sealed (opened by the gateway service, never
    shown: the API shows `api_key_hint`)."""

    id: UUID
    workspace_id: UUID
    name: str
    base_url: str
    api_key_ciphertext: bytes | None = field(repr=False)
    api_key_hint: str | None
    models: list[dict[str, Any]]  # {"name", "input_per_mtok", ...}, USD per 1M tokens
    connect_timeout_s: float
    ttft_timeout_s: float
    idle_timeout_s: float
    deadline_s: float
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        picked = pick(cls, values)
        sealed = picked["api_key_ciphertext"]
        picked["api_key_ciphertext"] = bytes(sealed) if sealed is not None else None
        return cls(**picked)


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """A model route as stored: a chain of {"provider", "model"} links, tried in order."""

    id: UUID
    workspace_id: UUID
    name: str
    chain: list[dict[str, str]]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, values: Mapping[Any, Any]) -> Self:
        """Build from a row's mapping."""
        return cls(**pick(cls, values))
