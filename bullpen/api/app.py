"""create_app: the FastAPI application over a Services built in its lifespan."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bullpen import __version__, gcpolicy
from bullpen.api import openapi, problems
from bullpen.api.deps import access_of
from bullpen.api.direct import DirectEndpoint
from bullpen.api.headers import SecurityHeaders
from bullpen.api.limits import BodyLimit
from bullpen.api.mcp.endpoint import PATH as MCP_PATH
from bullpen.api.mcp.endpoint import McpEndpoint
from bullpen.api.problems import RELAY_PREFIX
from bullpen.api.routes import (
    agents,
    api_keys,
    approvals,
    audit,
    budgets,
    events,
    invitations,
    mcp_servers,
    members,
    providers,
    relay,
    routines,
    runs,
    session,
    system,
    tasks,
    ui,
    ui_agents,
    ui_approvals,
    ui_audit,
    ui_costs,
    ui_providers,
    ui_routines,
    ui_settings,
    ui_tasks,
    users,
    workspaces,
)
from bullpen.app import build
from bullpen.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

# `bullpen.api.tracing.traced`, bound to the process's tracing (set only when tracing is on).
Traced = Callable[[ASGIApp, Scope, Receive, Send], Awaitable[None]]


class BullpenApp(FastAPI):
    """FastAPI, with the direct endpoints (the relay's hot path) served ahead of its
    middleware stack. Each does for itself what the stack would do (`bullpen.api.direct`)."""

    direct: dict[str, ASGIApp]  # POST endpoints by exact path
    traced: Traced | None = None  # tracing is on: every HTTP request gets its span

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            traced = self.traced
            if traced is not None:
                await traced(self._serve, scope, receive, send)
                return
        await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.direct.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                scope["bullpen.direct"] = True
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        # Outside Starlette's error middleware too: every answer, a 413 or a 500 included,
        # carries the security headers.
        return SecurityHeaders(super().build_middleware_stack())


API_ROUTERS: list[APIRouter] = [
    module.router
    for module in (
        relay,  # first: routes are matched in order, and the relay is the hot path
        workspaces,
        session,
        members,
        invitations,
        users,
        api_keys,
        agents,
        tasks,
        approvals,
        routines,
        runs,
        events,
        audit,
        providers,
        mcp_servers,
        budgets,
    )
]


def _document_access(router: APIRouter) -> None:
    """Publish each API route's declared access in OpenAPI as `x-bullpen-access`."""
    for route in router.routes:
        if isinstance(route, APIRoute):
            declared = access_of(route)
            if declared is not None:
                route.openapi_extra = {**(route.openapi_extra or {}), "x-bullpen-access": declared}


def create_app(settings: Settings, *, span_exporter: SpanExporter | None = None) -> FastAPI:
    """The HTTP application; its lifespan starts and stops every service.

    `span_exporter` (tests): spans go there too, and tracing is on whatever the settings."""
    mcp = McpEndpoint(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with build(settings, span_exporter=span_exporter) as services, mcp.run():
            app.state.services = services
            if services.tracing is not None:
                from bullpen.api.tracing import traced  # OpenTelemetry only when tracing

                bullpen_app.traced = functools.partial(traced, services.tracing)
            gcpolicy.settle()
            try:
                yield
            finally:
                bullpen_app.traced = None

    app = bullpen_app = BullpenApp(
        title="Bullpen",
        version=__version__,
        summary="Control plane for teams of LLM agents",
        lifespan=lifespan,
        # /docs is Bullpen's own page (routes/system.py); FastAPI's pages load from a CDN.
        docs_url=None,
        redoc_url=None,
        # Traces are Bullpen's own (bullpen.api.tracing): FastAPI's native telemetry would not
        # see the direct endpoints, would add spans per dependency and serialisation, and
        # records exception messages in logs; off even with FASTAPI_OTEL_AUTO_CONFIGURE set.
        telemetry={"tracing": False, "metrics": False, "logs": False, "auto_configure": False},
    )
    problems.install(app)

    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        prefixed=((RELAY_PREFIX, settings.relay_max_body_bytes),),
    )
    app.include_router(system.router)
    for router in API_ROUTERS:
        _document_access(router)
        app.include_router(router)
    app.include_router(ui.router)
    app.add_exception_handler(ui.SignedOut, ui.signed_out)
    for page_router in (
        ui_tasks.router,
        ui_agents.router,
        ui_approvals.router,
        ui_settings.router,
        ui_costs.router,
        ui_audit.router,
        ui_providers.router,
        ui_routines.router,
    ):
        app.include_router(page_router)
    # An ASGI app as the endpoint: every method reaches it (it answers 405 itself).
    app.router.routes.append(Route(MCP_PATH, mcp, include_in_schema=False))
    openapi.install(app)
    app.direct = {
        "/v1/chat/completions": DirectEndpoint(relay.chat_request, settings.relay_max_body_bytes),
        "/api/v1/tasks": DirectEndpoint(tasks.create_request, settings.max_body_bytes),
    }
    app.mount("/static", StaticFiles(directory=ui.WEB / "static"), name="static")
    return app
