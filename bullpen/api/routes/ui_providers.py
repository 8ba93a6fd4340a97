"""The dashboard's providers and routes page: providers with their models, prices, timeouts,
key hint and circuit breaker (as this process sees it); add, edit, check and delete them;
model routes with their fallback chains, each link moved up or down, added or removed, by
plain forms that work without JavaScript.

Every read and change goes through the gateway configuration service, as the API's do, and
bodies are checked by the API's own schemas, so errors read the same. A provider's key is a
password field that is never filled back in: the page shows its hint only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import Found, form_session, message, page, page_session, refused
from bullpen.api.schemas.gateway import (
    ProviderCreate,
    ProviderUpdate,
    RouteCreate,
    RouteUpdate,
)
from bullpen.app import Services
from bullpen.errors import BullpenError, Conflict, InvalidInput, ProviderError
from bullpen.gateway.breaker import BreakerState
from bullpen.gateway.check import CheckResult

router = APIRouter(include_in_schema=False)

SECTION = "providers"
TIMEOUTS = (
    ("connect_s", "Connect"),
    ("ttft_s", "First token"),
    ("idle_s", "Between chunks"),
    ("deadline_s", "Whole call"),
)
_STATE_NAMES = {
    BreakerState.CLOSED: "closed",
    BreakerState.OPEN: "open",
    BreakerState.HALF_OPEN: "half-open",
}
MODELS_HELP = "one a line: name, input, output and (optional) cached input price"


@dataclass(frozen=True, slots=True)
class BreakerShown:
    """A provider's breaker for the page: its state and since when (UTC)."""

    state: str
    since: datetime
    failures: int
    probing: bool
    until: datetime | None  # an open breaker's end of cooldown


@dataclass(frozen=True, slots=True)
class Checked:
    """The outcome of a check, for the page."""

    name: str
    result: CheckResult | None = None
    error: ProviderError | None = None


def _validation_message(err: ValidationError) -> str:
    """The API's field errors (`loc: msg`), as one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


async def _form(request: Request) -> dict[str, str]:
    data = await request.form()
    return {k: v for k, v in data.items() if isinstance(v, str)}


def _number(text: str) -> Any:
    """A form's number as the API would receive it: a float, or the text (then refused)."""
    try:
        return float(text.strip())
    except ValueError:
        return text.strip()


def models_of(text: str) -> list[dict[str, Any]]:
    """The models textarea: `name input output [cached]` a line, spaces or commas apart."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = line.replace(",", " ").split()
        if not parts:
            continue
        model: dict[str, Any] = {"name": parts[0]}
        for key, value in zip(
            ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok"),
            parts[1:],
            strict=False,
        ):
            model[key] = _number(value)
        if len(parts) > 4:
            raise InvalidInput(f"models: {parts[0]!r} has more than 3 prices ({MODELS_HELP})")
        out.append(model)
    return out


def models_text(models: list[dict[str, Any]]) -> str:
    """A provider's models as the textarea shows them."""
    return "\n".join(
        f"{m['name']} {m['input_per_mtok']:g} {m['output_per_mtok']:g} "
        f"{m['cached_input_per_mtok']:g}"
        for m in models
    )


def _timeouts_of(form: dict[str, str]) -> dict[str, Any]:
    return {key: _number(form[key]) for key, _ in TIMEOUTS if form.get(key, "").strip()}


def breakers_of(svc: Services, keys: list[str]) -> dict[str, BreakerShown]:
    """What this process's breakers say of these providers (none: never called from here)."""
    breakers = svc.gateway.router.breakers
    now = svc.clock()
    out: dict[str, BreakerShown] = {}
    for key in keys:
        view = breakers.view(key)
        if view is None:
            continue
        since = now - timedelta(seconds=view.for_s)
        until = None
        if view.state is BreakerState.OPEN:
            until = since + timedelta(seconds=breakers.policy.cooldown_s)
        out[key] = BreakerShown(_STATE_NAMES[view.state], since, view.failures, view.probing, until)
    return out


async def _providers(
    request: Request,
    svc: Services,
    found: Found,
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
    checked: Checked | None = None,
    confirm_route: UUID | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    try:
        providers = await svc.gateway_config.list_providers(principal)
        routes = await svc.gateway_config.list_routes(principal)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    builtins = svc.directory.builtins
    keys = [p.key for p in builtins] + [str(p.id) for p in providers]
    choices = [(p.name, [m["name"] for m in p.models]) for p in providers] + [
        (p.name, sorted(p.prices)) for p in builtins
    ]
    return await page(
        request,
        svc,
        found,
        "providers.html",
        section=SECTION,
        status=status,
        error=error,
        form=form or {},
        providers=providers,
        builtins=builtins,
        routes=routes,
        breakers=breakers_of(svc, keys),
        policy=svc.gateway.router.breakers.policy,
        pid=os.getpid(),
        runs_worker=svc.worker is not None,
        choices=choices,
        checked=checked,
        confirm_route=confirm_route,
        timeouts=TIMEOUTS,
        defaults=svc.provider_defaults,
        models_help=MODELS_HELP,
    )


@router.get("/providers", response_class=HTMLResponse, response_model=None)
async def providers_page(request: Request, svc: ServicesDep) -> Response:
    """Providers with their breakers, model routes with their chains, and the forms."""
    found = await page_session(request, svc)
    return await _providers(request, svc, found)


@router.post("/ui/providers", response_model=None)
async def create_provider(request: Request, svc: ServicesDep) -> Response:
    """Add a provider, checked by the API's schema; its key is never shown again."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    kept = {k: v for k, v in form.items() if k not in {"csrf", "api_key"}}
    kept["new_provider"] = "1"
    try:
        body = ProviderCreate.model_validate(
            {
                "name": form.get("name", "").strip(),
                "base_url": form.get("base_url", "").strip(),
                "api_key": form.get("api_key") or None,
                "models": models_of(form.get("models", "")),
                "timeouts": _timeouts_of(form),
            }
        )
        await svc.gateway_config.create_provider(
            found[1].principal,
            name=body.name,
            base_url=body.base_url,
            api_key=body.api_key,
            models=[m.stored() for m in body.models],
            timeouts=body.timeouts.model_dump(exclude_unset=True),
        )
    except ValidationError as err:
        error = _validation_message(err)
        return await _providers(request, svc, found, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail, form=kept)
    return RedirectResponse("/providers", status_code=303)


async def _provider(
    request: Request,
    svc: Services,
    found: Found,
    provider_id: UUID,
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
    confirm: bool = False,
) -> HTMLResponse:
    try:
        row = await svc.gateway_config.get_provider(found[1].principal, provider_id)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    return await page(
        request,
        svc,
        found,
        "provider.html",
        section=SECTION,
        status=status,
        error=error,
        form=form or {},
        provider=row,
        models=models_text(row.models),
        breaker=breakers_of(svc, [str(row.id)]).get(str(row.id)),
        timeouts=TIMEOUTS,
        confirm=confirm,
        models_help=MODELS_HELP,
    )


@router.get("/providers/{provider_id}", response_class=HTMLResponse, response_model=None)
async def provider_page(provider_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """One provider: its edit form, check and delete."""
    found = await page_session(request, svc)
    return await _provider(request, svc, found, provider_id)


@router.post("/ui/providers/{provider_id}", response_model=None)
async def update_provider(provider_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """Change a provider from its edit form, validated as the API's PATCH is. An empty key
    field keeps the key; moving the provider to another origin needs the key again."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    kept = {k: v for k, v in form.items() if k not in {"csrf", "api_key"}}
    try:
        given: dict[str, Any] = {
            "name": form.get("name", "").strip(),
            "base_url": form.get("base_url", "").strip(),
            "models": models_of(form.get("models", "")),
            "timeouts": _timeouts_of(form),
        }
        if form.get("remove_key") == "on":
            given["api_key"] = None
        elif form.get("api_key"):
            given["api_key"] = form["api_key"]
        body = ProviderUpdate.model_validate(given)
        changes = body.model_dump(exclude_unset=True)
        if "api_key" in changes:
            changes["api_key"] = body.api_key
        changes["models"] = [m.stored() for m in body.models]
        changes["timeouts"] = body.timeouts.model_dump(exclude_unset=True)
        await svc.gateway_config.update_provider(found[1].principal, provider_id, changes)
    except ValidationError as err:
        error = _validation_message(err)
        return await _provider(request, svc, found, provider_id, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _provider(
            request, svc, found, provider_id, status=err.status, error=err.detail, form=kept
        )
    return RedirectResponse(f"/providers/{provider_id}", status_code=303)


@router.post("/ui/providers/{provider_id}/check", response_model=None)
async def check_provider(
    provider_id: UUID,
    request: Request,
    svc: ServicesDep,
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Call the provider once now and show how it answered (or why it did not)."""
    found = await form_session(request, svc, csrf)
    principal = found[1].principal
    try:
        row = await svc.gateway_config.get_provider(principal, provider_id)
        try:
            result = await svc.gateway_config.check_provider(principal, provider_id)
        except ProviderError as err:
            checked = Checked(row.name, error=err)
            return await _providers(request, svc, found, status=err.status, checked=checked)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    return await _providers(request, svc, found, checked=Checked(row.name, result=result))


@router.post("/ui/providers/{provider_id}/delete", response_model=None)
async def delete_provider(
    provider_id: UUID,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Delete a provider no route uses: the first post asks for confirmation."""
    found = await form_session(request, svc, csrf)
    if confirmed != "yes":
        return await _provider(request, svc, found, provider_id, confirm=True)
    try:
        await svc.gateway_config.delete_provider(found[1].principal, provider_id)
    except BullpenError as err:
        await refused(request, err)
        return await _provider(
            request, svc, found, provider_id, status=err.status, error=err.detail
        )
    return RedirectResponse("/providers", status_code=303)


# ---- model routes ------------------------------------------------------------------------


def link_of(text: str) -> dict[str, str]:
    """`provider/model` as a chain link (a model name may itself hold `/`)."""
    provider, _, model = text.strip().partition("/")
    return {"provider": provider.strip(), "model": model.strip()}


def _link_text(link: dict[str, str]) -> str:
    return f"{link['provider']}/{link['model']}"


@router.post("/ui/model-routes", response_model=None)
async def create_route(request: Request, svc: ServicesDep) -> Response:
    """Add a route: a name and its chain, one `provider/model` a line, tried in order."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    kept = {k: v for k, v in form.items() if k != "csrf"}
    kept["new_route"] = "1"
    chain = [link_of(line) for line in form.get("chain", "").splitlines() if line.strip()]
    try:
        body = RouteCreate.model_validate(
            {"name": form.get("route_name", "").strip(), "chain": chain}
        )
        await svc.gateway_config.create_route(
            found[1].principal, name=body.name, chain=[c.model_dump() for c in body.chain]
        )
    except ValidationError as err:
        error = _validation_message(err)
        return await _providers(request, svc, found, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail, form=kept)
    return RedirectResponse("/providers#routes", status_code=303)


async def _change_route(
    request: Request, svc: Services, found: Found, route_id: UUID, given: dict[str, Any]
) -> Response:
    """Apply a route change validated by the API's schema; the page again, or its error."""
    try:
        body = RouteUpdate.model_validate(given)
        changes = body.model_dump(exclude_unset=True)
        await svc.gateway_config.update_route(found[1].principal, route_id, changes)
    except ValidationError as err:
        error = _validation_message(err)
        return await _providers(request, svc, found, status=422, error=error)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    return RedirectResponse(f"/providers#route-{route_id}", status_code=303)


async def _chain(
    svc: Services, found: Found, route_id: UUID, index: int, expect: str
) -> list[dict[str, str]]:
    """The route's chain now, refused if link `index` is no longer what the page showed."""
    route = await svc.gateway_config.get_route(found[1].principal, route_id)
    chain = [dict(link) for link in route.chain]
    if not 0 <= index < len(chain) or _link_text(chain[index]) != expect:
        raise Conflict(
            f"route {route.name!r} changed since this page was shown; it is listed as it is now"
        )
    return chain


@router.post("/ui/model-routes/{route_id}/move", response_model=None)
async def move_link(
    route_id: UUID,
    request: Request,
    svc: ServicesDep,
    index: Annotated[int, Form(ge=0, le=100)] = 0,
    link: Annotated[str, Form(max_length=400)] = "",
    direction: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Move one link of a route's chain up or down (tried earlier or later)."""
    found = await form_session(request, svc, csrf)
    try:
        if direction not in ("up", "down"):
            raise InvalidInput("direction: up or down")
        chain = await _chain(svc, found, route_id, index, link)
        other = index - 1 if direction == "up" else index + 1
        if not 0 <= other < len(chain):
            raise InvalidInput(
                f"the link is already the {'first' if direction == 'up' else 'last'}"
            )
        chain[index], chain[other] = chain[other], chain[index]
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    return await _change_route(request, svc, found, route_id, {"chain": chain})


@router.post("/ui/model-routes/{route_id}/remove", response_model=None)
async def remove_link(
    route_id: UUID,
    request: Request,
    svc: ServicesDep,
    index: Annotated[int, Form(ge=0, le=100)] = 0,
    link: Annotated[str, Form(max_length=400)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Remove one link of a route's chain (the last one cannot go: delete the route)."""
    found = await form_session(request, svc, csrf)
    try:
        chain = await _chain(svc, found, route_id, index, link)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    del chain[index]
    return await _change_route(request, svc, found, route_id, {"chain": chain})


@router.post("/ui/model-routes/{route_id}/add", response_model=None)
async def add_link(
    route_id: UUID,
    request: Request,
    svc: ServicesDep,
    provider: Annotated[str, Form(max_length=200)] = "",
    model: Annotated[str, Form(max_length=400)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Add a link at the end of a route's chain."""
    found = await form_session(request, svc, csrf)
    try:
        route = await svc.gateway_config.get_route(found[1].principal, route_id)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    chain = [*route.chain, {"provider": provider.strip(), "model": model.strip()}]
    return await _change_route(request, svc, found, route_id, {"chain": chain})


@router.post("/ui/model-routes/{route_id}/rename", response_model=None)
async def rename_route(
    route_id: UUID,
    request: Request,
    svc: ServicesDep,
    route_name: Annotated[str, Form(max_length=400)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Rename a route (agents naming the old name fail until they name the new one)."""
    found = await form_session(request, svc, csrf)
    return await _change_route(request, svc, found, route_id, {"name": route_name.strip()})


@router.post("/ui/model-routes/{route_id}/delete", response_model=None)
async def delete_route(
    route_id: UUID,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Delete a route: the first post asks for confirmation."""
    found = await form_session(request, svc, csrf)
    if confirmed != "yes":
        return await _providers(request, svc, found, confirm_route=route_id)
    try:
        await svc.gateway_config.delete_route(found[1].principal, route_id)
    except BullpenError as err:
        await refused(request, err)
        return await _providers(request, svc, found, status=err.status, error=err.detail)
    return RedirectResponse("/providers#routes", status_code=303)
