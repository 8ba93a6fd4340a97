"""/api/v1/providers and /api/v1/model-routes: what the gateway may call, and in which order."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlsplit
from uuid import UUID

from fastapi import APIRouter, Depends, Response
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)

from bullpen.api import docs
from bullpen.api.deps import GatewayConfigs as Config
from bullpen.api.deps import require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas import Strict, optional
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
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
    def from_row(cls, row: Any) -> ProviderPublic:
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
    def from_row(cls, row: Any) -> RoutePublic:
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


router = APIRouter(prefix="/api/v1", tags=["gateway"])

ProviderId = Annotated[UUID, docs.path_id("provider")]
RouteId = Annotated[UUID, docs.path_id("model route")]
Reader = Annotated[Principal, require(Permission.PROVIDERS_READ)]
Writer = Annotated[Principal, require(Permission.PROVIDERS_WRITE)]


def _timeouts(given: TimeoutsIn) -> dict[str, float]:
    return given.model_dump(exclude_unset=True)


@router.get(
    "/providers",
    operation_id="listProviders",
    response_model=ProviderList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List providers",
)
async def list_providers(principal: Reader, config: Config) -> ProviderList:
    """The workspace's providers by name; keys appear only as hints."""
    rows = await config.list_providers(principal)
    return ProviderList(items=[ProviderPublic.from_row(r) for r in rows])


@router.post(
    "/providers",
    operation_id="createProvider",
    status_code=201,
    response_model=ProviderPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            ProviderPublic,
            "The provider",
            {
                "GetProvider": docs.link("getProvider", provider_id="$response.body#/id"),
                "UpdateProvider": docs.link("updateProvider", provider_id="$response.body#/id"),
                "DeleteProvider": docs.link("deleteProvider", provider_id="$response.body#/id"),
            },
        ),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Add a provider",
)
async def create_provider(
    body: ProviderCreate, principal: Writer, config: Config, idem: Idempotent
) -> Response:
    """Add an OpenAI-compatible provider. Its API key is encrypted at rest and never shown."""
    async with idem.begin(principal) as tx:
        if tx.replayed is not None:
            return tx.replayed
        row = await config.create_provider(
            principal,
            name=body.name,
            base_url=body.base_url,
            api_key=body.api_key,
            models=[m.stored() for m in body.models],
            timeouts=_timeouts(body.timeouts),
        )
        return tx.respond(201, ProviderPublic.from_row(row), location=f"/api/v1/providers/{row.id}")


@router.get(
    "/providers/{provider_id}",
    operation_id="getProvider",
    response_model=ProviderPublic,
    responses=docs.problems(*docs.READ),
    summary="Get a provider",
)
async def get_provider(
    provider_id: ProviderId, principal: Reader, config: Config
) -> ProviderPublic:
    """One provider of the workspace."""
    return ProviderPublic.from_row(await config.get_provider(principal, provider_id))


@router.patch(
    "/providers/{provider_id}",
    operation_id="updateProvider",
    response_model=ProviderPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Change a provider",
)
async def update_provider(
    provider_id: ProviderId, body: ProviderUpdate, principal: Writer, config: Config
) -> ProviderPublic:
    """Only the fields sent change. `api_key: null` removes the key; renaming a provider that
    routes use is 409. Moving a provider with a key to another scheme, host or port without
    sending `api_key` (a key, or `null`) is 422 `provider-key-required`: a key goes only where
    it was given for."""
    changes = body.model_dump(exclude_unset=True)
    if "api_key" in changes:
        changes["api_key"] = body.api_key
    if "models" in changes:
        changes["models"] = [m.stored() for m in body.models]
    if "timeouts" in changes:
        changes["timeouts"] = _timeouts(body.timeouts)
    return ProviderPublic.from_row(await config.update_provider(principal, provider_id, changes))


@router.delete(
    "/providers/{provider_id}",
    operation_id="deleteProvider",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 409, 422, 429, 503),
    summary="Delete a provider no route uses",
)
async def delete_provider(provider_id: ProviderId, principal: Writer, config: Config) -> Response:
    """Delete a provider; one that model routes still use is 409."""
    await config.delete_provider(principal, provider_id)
    return Response(status_code=204)


@router.get(
    "/model-routes",
    operation_id="listModelRoutes",
    response_model=RouteList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List model routes",
)
async def list_routes(principal: Reader, config: Config) -> RouteList:
    """The workspace's model routes by name."""
    rows = await config.list_routes(principal)
    return RouteList(items=[RoutePublic.from_row(r) for r in rows])


@router.post(
    "/model-routes",
    operation_id="createModelRoute",
    status_code=201,
    response_model=RoutePublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            RoutePublic,
            "The model route",
            {
                "GetModelRoute": docs.link("getModelRoute", route_id="$response.body#/id"),
                "UpdateModelRoute": docs.link("updateModelRoute", route_id="$response.body#/id"),
                "DeleteModelRoute": docs.link("deleteModelRoute", route_id="$response.body#/id"),
            },
        ),
        **docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    },
    summary="Add a model route",
)
async def create_route(
    body: RouteCreate, principal: Writer, config: Config, idem: Idempotent
) -> Response:
    """Add a route; every link must name a provider of the workspace (or a built-in one) and,
    if that provider lists models, one of them (404 otherwise)."""
    async with idem.begin(principal) as tx:
        if tx.replayed is not None:
            return tx.replayed
        row = await config.create_route(
            principal, name=body.name, chain=[link.model_dump() for link in body.chain]
        )
        return tx.respond(201, RoutePublic.from_row(row), location=f"/api/v1/model-routes/{row.id}")


@router.get(
    "/model-routes/{route_id}",
    operation_id="getModelRoute",
    response_model=RoutePublic,
    responses=docs.problems(*docs.READ),
    summary="Get a model route",
)
async def get_route(route_id: RouteId, principal: Reader, config: Config) -> RoutePublic:
    """One model route of the workspace."""
    return RoutePublic.from_row(await config.get_route(principal, route_id))


@router.patch(
    "/model-routes/{route_id}",
    operation_id="updateModelRoute",
    response_model=RoutePublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Rename a model route or replace its chain",
)
async def update_route(
    route_id: RouteId, body: RouteUpdate, principal: Writer, config: Config
) -> RoutePublic:
    """Only the fields sent change."""
    changes = body.model_dump(exclude_unset=True)
    return RoutePublic.from_row(await config.update_route(principal, route_id, changes))


@router.delete(
    "/model-routes/{route_id}",
    operation_id="deleteModelRoute",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Delete a model route",
)
async def delete_route(route_id: RouteId, principal: Writer, config: Config) -> Response:
    """Delete a route (agents that name it fail their next run until it exists again)."""
    await config.delete_route(principal, route_id)
    return Response(status_code=204)
