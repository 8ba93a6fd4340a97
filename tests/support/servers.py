"""A Bullpen server on a real socket in the test's event loop, and the settings tests give it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from opentelemetry.sdk.trace.export import SpanExporter

from bullpen.api.app import create_app
from bullpen.api.edge import server_config
from bullpen.app import Services, open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import Bootstrap, ensure_bootstrap
from bullpen.settings import Settings

BACKENDS = ["sqlite", "postgres"]

# Fast simulator settings for tests: behaviour, not speed, is under test here.
FAST_SIM = {"sim_ttft_ms": 20.0, "sim_tokens_per_second": 2000.0, "sim_response_tokens": 24}


def marked_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The Settings fields a test's `with_settings(...)` marker changes (validated)."""
    marker = request.node.get_closest_marker("with_settings")
    if marker is None:
        return {}
    unknown = set(marker.kwargs) - set(Settings.model_fields)
    if unknown:
        raise pytest.UsageError(f"with_settings: unknown Settings fields {sorted(unknown)}")
    return dict(marker.kwargs)


@dataclass
class RunningServer:
    """A Bullpen server on a real socket in this event loop."""

    base_url: str
    services: Services
    boot: Bootstrap
    settings: Settings
    app: Any = None  # the ASGI app it serves (`BullpenApp`)

    @property
    def auth(self) -> dict[str, str]:
        """Headers that authenticate as the bootstrap admin's key."""
        return {"Authorization": f"Bearer {self.boot.api_key}"}


async def start_server(
    settings: Settings, span_exporter: SpanExporter | None = None
) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """Serve create_app(settings) on an ephemeral port; returns (server, task, base URL).
    With `span_exporter`, tracing is on and its spans go there."""
    config = server_config(
        create_app(settings, span_exporter=span_exporter),
        settings,
        host="127.0.0.1",
        port=0,
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, task, f"http://127.0.0.1:{port}"


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[RunningServer]:
    """A bootstrapped server (API + worker + simulated provider) on `settings`, in this event
    loop; stopped on exit. The `server` fixtures' body."""
    async with open_store(settings) as st:
        boot = await ensure_bootstrap(
            st, load_secret(settings.secret_key, settings.data_dir), utcnow
        )
    srv, task, base_url = await start_server(settings)
    app = srv.config.app
    try:
        yield RunningServer(base_url, app.state.services, boot, settings, app)
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 15)
