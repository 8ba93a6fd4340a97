"""create_app: the FastAPI application over a Services built in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bullpen import __version__, gcpolicy
from bullpen.api import openapi, problems
from bullpen.api.deps import access_of
from bullpen.api.limits import BodyLimit
from bullpen.api.problems import RELAY_PREFIX
from bullpen.api.routes import (
    agents,
    api_keys,
    audit,
    events,
    members,
    providers,
    relay,
    routines,
    runs,
    system,
    tasks,
    ui,
    users,
    workspaces,
)
from bullpen.app import build
from bullpen.settings import Settings

_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    ),
]


class SecurityHeaders:
    """Add security headers to every response (pure ASGI: streams pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in _SECURITY_HEADERS if n not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


API_ROUTERS: list[APIRouter] = [
    module.router
    for module in (
        relay,  # first: routes are matched in order, and the relay is the hot path
        workspaces,
        members,
        users,
        api_keys,
        agents,
        tasks,
        routines,
        runs,
        events,
        audit,
        providers,
    )
]


def _document_access(router: APIRouter) -> None:
    """Publish each API route's declared access in OpenAPI as `x-bullpen-access`."""
    for route in router.routes:
        if isinstance(route, APIRoute):
            declared = access_of(route)
            if declared is not None:
                route.openapi_extra = {**(route.openapi_extra or {}), "x-bullpen-access": declared}


def create_app(settings: Settings) -> FastAPI:
    """The HTTP application; its lifespan starts and stops every service."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with build(settings) as services:
            app.state.services = services
            gcpolicy.settle()
            yield

    app = FastAPI(
        title="Bullpen",
        version=__version__,
        summary="Control plane for teams of LLM agents",
        lifespan=lifespan,
    )
    problems.install(app)

    app.add_middleware(SecurityHeaders)
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
    openapi.install(app)
    app.mount("/static", StaticFiles(directory=ui.WEB / "static"), name="static")
    return app
