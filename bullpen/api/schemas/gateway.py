"""Wire schemas of the gateway's configuration: providers and model routes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlsplit
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from bullpen.api.schemas.common import Strict, optional
from bullpen.domain.records.gateway import ProviderRecord, RouteRecord
from bullpen.services.gateway import MAX_CHAIN

MODELS_MAX = 100
PRICE_MAX = 100_000.0  # USD per million tokens
API_KEY_MAX = 1000

# No `/`: `provider/model` names a provider's model directly.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# Printable, no control characters, no leading or trailing whitespace.
_WORD = r"^[^\x00-\x20\x7f]([^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"

Name = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_NAME)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_WORD)]
PricePerMTok = Annotated[float, Field(ge=0, le=PRICE_MAX, allow_inf_nan=False, strict=True)]
Seconds = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False, strict=True)]


def _base_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials; set `api_key` instead")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ValueError("has a malformed port") from None
    return value.rstrip("/")


# 0-65535, so every URL the pattern allows has a valid port.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
BaseUrl = Annotated[
    str,
    StringConstraints(
        min_length=8,
        max_length=2000,
        # A host name or IPv4 address, or an IPv6 address in brackets.
        pattern=r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:" + _PORT + r")?(/[^\s?#]*)?$",
    ),
    AfterValidator(_base_url),
]
_BASE_URL_DOC = (
    "The OpenAI-style base URL, e.g. ending in `/v1`. Private, loopback, link-local and other "
    "non-public addresses are refused (here and whenever the host resolves to one) unless "
    "the server's BULLPEN_OUTBOUND_ALLOW names them."
)
ApiKey = Annotated[
    str, StringConstraints(min_length=1, max_length=API_KEY_MAX, pattern=r"^[\x21-\x7e]+$")
]


class ModelPrice(Strict):
    """A model the provider offers and its price, in USD per million tokens."""

    name: ModelName = Field(examples=["gpt-4o-mini"])
    input_per_mtok: PricePerMTok = 0.0
    cached_input_per_mtok: PricePerMTok | None = Field(
        default=None, description="Price of cached input tokens; omit for the input price."
    )
    output_per_mtok: PricePerMTok = 0.0

    def stored(self) -> dict[str, Any]:
        """As kept in the provider row."""
        cached = self.cached_input_per_mtok
        return {
            "name": self.name,
            "input_per_mtok": self.input_per_mtok,
            "cached_input_per_mtok": self.input_per_mtok if cached is None else cached,
            "output_per_mtok": self.output_per_mtok,
        }


class TimeoutsIn(Strict):
    """Limits for calls to this provider, in seconds; omitted ones take the server defaults."""

    connect_s: Seconds = optional("Connecting (TCP and TLS).")
    ttft_s: Seconds = optional("From sending the request to the first content token.")
    idle_s: Seconds = optional("Between two chunks of a stream.")
    deadline_s: Seconds = optional("The whole attempt.")


class ProviderCreate(Strict):
    """A new OpenAI-compatible provider."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "openai",
                    "base_url": "https://api.openai.com/v1",
                    "api_key": "sk-…",
                    "models": [
                        {"name": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.6}
                    ],
                }
            ]
        },
    )

    name: Name = Field(description="Unique in the workspace; routes refer to it.")
    base_url: BaseUrl = Field(description=_BASE_URL_DOC)
    api_key: ApiKey | None = Field(
        default=None,
        repr=False,
        description="Stored encrypted; never returned (only a masked hint).",
    )
    models: list[ModelPrice] = Field(default_factory=list, max_length=MODELS_MAX)
    timeouts: TimeoutsIn = Field(default_factory=TimeoutsIn)

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[ModelPrice]) -> list[ModelPrice]:
        return _unique_models(models)


class ProviderUpdate(Strict):
    """Change a provider (send only what changes)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"api_key": "sk-new…"}, {"timeouts": {"ttft_s": 20}}]},
    )

    name: Name = optional()
    base_url: BaseUrl = optional(
        _BASE_URL_DOC + " Another scheme, host or port needs `api_key` in the same request."
    )
    api_key: ApiKey | None = Field(
        default=None,
        repr=False,
        description="A new key; `null` removes the key. Required (a key or `null`) when "
        "`base_url` moves to another scheme, host or port of a provider that has a key.",
    )
    models: list[ModelPrice] = optional("Replaces the whole list.")
    timeouts: TimeoutsIn = optional("Only the limits sent change.")

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[ModelPrice]) -> list[ModelPrice]:
        return _unique_models(models)


def _unique_models(models: list[ModelPrice]) -> list[ModelPrice]:
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError("model names must be unique")
    return models


class ModelPricePublic(BaseModel):
    """A model and its prices (USD per million tokens)."""

    name: str
    input_per_mtok: float
    cached_input_per_mtok: float
    output_per_mtok: float


class TimeoutsPublic(BaseModel):
    """The provider's limits, in seconds."""

    connect_s: float
    ttft_s: float
    idle_s: float
    deadline_s: float


class ProviderPublic(BaseModel):
    """A provider as the API shows it: never its key, only a hint of it."""

    id: UUID
    name: str
    base_url: str
    api_key_hint: str | None = Field(
        examples=["sk-…a1b2"], description="First and last characters of the key, if one is set"
    )
    models: list[ModelPricePublic]
    timeouts: TimeoutsPublic
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: ProviderRecord) -> ProviderPublic:
        """Build from a `providers` row."""
        return cls(
            id=row.id,
            name=row.name,
            base_url=row.base_url,
            api_key_hint=row.api_key_hint,
            models=[ModelPricePublic(**m) for m in row.models],
            timeouts=TimeoutsPublic(
                connect_s=row.connect_timeout_s,
                ttft_s=row.ttft_timeout_s,
                idle_s=row.idle_timeout_s,
                deadline_s=row.deadline_s,
            ),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class ProviderList(BaseModel):
    """The workspace's providers by name (built-in ones are not listed)."""

    items: list[ProviderPublic]


class RouteLink(Strict):
    """One step of a fallback chain."""

    provider: Name
    model: ModelName


# A link may repeat: the same provider and model tried again further down the chain.
Chain = Annotated[list[RouteLink], Field(min_length=1, max_length=MAX_CHAIN)]


class RouteCreate(Strict):
    """A model route: a name agents and relay callers use, and its fallback chain."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "smart",
                    "chain": [
                        {"provider": "openai", "model": "gpt-4o"},
                        {"provider": "backup", "model": "gpt-4o"},
                    ],
                }
            ]
        },
    )

    name: Name
    chain: Chain = Field(description="Tried in order until one provider serves the call.")


class RouteUpdate(Strict):
    """Rename a route or replace its chain."""

    model_config = ConfigDict(extra="forbid")

    name: Name = optional()
    chain: Chain = optional("Replaces the whole chain.")


class RoutePublic(BaseModel):
    """A model route."""

    id: UUID
    name: str
    chain: list[RouteLink]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: RouteRecord) -> RoutePublic:
        """Build from a `model_routes` row."""
        return cls(
            id=row.id,
            name=row.name,
            chain=[RouteLink(**link) for link in row.chain],
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


class RouteList(BaseModel):
    """The workspace's model routes by name."""

    items: list[RoutePublic]


class ProviderCheck(Strict):
    """Which model a provider check calls."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"model": "sim-1"}]})

    model: ModelName | None = Field(
        default=None, description="One of the provider's models; omitted: the first it lists."
    )


class ProviderCheckResult(BaseModel):
    """A provider answered a check: how fast, and as which model."""

    ok: bool = Field(description="Always true: a failed check is a problem+json answer")
    provider: str
    model: str = Field(description="The model asked for")
    served_model: str | None = Field(description="The model the provider said answered")
    ttft_ms: float = Field(description="From sending the request to the first content")
    latency_ms: float = Field(description="From sending the request to the stream's end")
    finish_reason: str | None
    input_tokens: int | None = Field(description="As the provider reported them, if it did")
    output_tokens: int | None
