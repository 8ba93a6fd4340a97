"""create_app: the FastAPI application over a Services built in its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.staticfiles import StaticFiles

from bullpen import __version__
from bullpen.api import problems
from bullpen.api.limits import BodyLimit
from bullpen.api.routes import system, tasks, ui
from bullpen.app import build
from bullpen.settings import Settings

_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
}


def create_app(settings: Settings) -> FastAPI:
    """The HTTP application; its lifespan starts and stops every service."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with build(settings) as services:
            app.state.services = services
            yield

    app = FastAPI(
        title="Bullpen",
        version=__version__,
        summary="Control plane for teams of LLM agents",
        lifespan=lifespan,
    )
    problems.install(app)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.include_router(system.router)
    app.include_router(tasks.router)
    app.include_router(ui.router)
    app.mount("/static", StaticFiles(directory=ui.WEB / "static"), name="static")
    return app
