"""/api/v1/providers and /api/v1/model-routes: what the gateway may call, and in which order."""

from __future__ import annotations

import logging
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response

from bullpen.api import docs
from bullpen.api.deps import GatewayConfigs as Config
from bullpen.api.deps import check_json, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.problems import from_error
from bullpen.api.schemas.common import Problem
from bullpen.api.schemas.gateway import (
    ProviderCheck,
    ProviderCheckResult,
    ProviderCreate,
    ProviderList,
    ProviderPublic,
    ProviderUpdate,
    RouteCreate,
    RouteList,
    RoutePublic,
    RouteUpdate,
    TimeoutsIn,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.errors import ProviderError

log = logging.getLogger(__name__)

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


class ProviderCheckProblem(Problem):
    """A failed provider check: the problem, with what failed and why."""

    reason: str = "connect"
    provider: str = "openai"
    model: str = "gpt-4o-mini"


_CHECK_FAILED = {
    400: "The provider refused the request itself (`provider-rejected`)",
    402: "The provider's quota or spend limit is used up (`provider-spend-limit`)",
    502: "The provider could not be reached, refused the key, answered an error status "
    "(`reason` `http-503` and so on) or a broken stream",
    504: "No first token, no next chunk or no end within the provider's limits",
}


async def _json_if_any(request: Request) -> None:
    """The body is optional; one that is sent must be JSON (else 415)."""
    if request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers:
        check_json(request)


@router.post(
    "/providers/{provider_id}/test",
    operation_id="testProvider",
    response_model=ProviderCheckResult,
    dependencies=[Depends(_json_if_any)],
    responses={
        **docs.problems(401, 403, 404, 413, 415, 422, 429, 503),
        **{
            code: {
                "model": ProviderCheckProblem,
                "description": text,
                "content": {"application/problem+json": {}},
            }
            for code, text in _CHECK_FAILED.items()
        },
    },
    summary="Check a provider with one minimal call",
)
async def test_provider(
    provider_id: ProviderId,
    principal: Writer,
    config: Config,
    request: Request,
    body: ProviderCheck | None = None,
) -> Any:
    """Make one minimal streamed chat completion to the provider now (`model`, else the first
    it lists; one it does not list is 404; at most 8 output tokens), through the gateway's
    client with the provider's timeouts, key and the outbound guard, without fallback or retry
    and without touching its circuit breaker. 200 says how fast it answered; a failure is
    problem+json with the provider's status class, `reason` (`connect`, `http-401`,
    `ttft-timeout`, ...), `provider` and `model`. Never metered nor charged to a budget; at
    most 2 checks run at once per workspace (429)."""
    model = body.model if body is not None else None
    try:
        result = await config.check_provider(principal, provider_id, model)
    except ProviderError as err:
        row = await config.get_provider(principal, provider_id)
        asked = model or (row.models[0]["name"] if row.models else "")
        log.info("provider check of %r failed: %s (%s)", row.name, err.reason, err.status)
        return from_error(
            err,
            request.url.path,
            {"reason": err.reason, "provider": row.name, "model": asked},
        )
    return ProviderCheckResult(
        ok=True,
        provider=result.provider,
        model=result.model,
        served_model=result.served_model,
        ttft_ms=result.ttft_ms,
        latency_ms=result.latency_ms,
        finish_reason=result.finish_reason,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
    )


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
