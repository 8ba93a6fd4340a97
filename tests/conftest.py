"""Shared fixtures: real SQLite and real PostgreSQL stores, and a real server on a socket."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import uvicorn

from bullpen.api.app import create_app
from bullpen.api.edge import server_config
from bullpen.app import Services, open_store, utcnow
from bullpen.services.bootstrap import Bootstrap, ensure_bootstrap
from bullpen.services.secrets import load_secret
from bullpen.settings import Settings
from bullpen.store.base import Store
from tests.support import suite

PG_ADMIN_URL = os.environ.get("BULLPEN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgres"]

# Fast simulator settings for tests: behaviour, not speed, is under test here.
FAST_SIM = {"sim_ttft_ms": 20.0, "sim_tokens_per_second": 2000.0, "sim_response_tokens": 24}


def _pg_host_port() -> tuple[str, int]:
    rest = PG_ADMIN_URL.split("@", 1)[1].split("/", 1)[0]
    host, _, port = rest.partition(":")
    return host, int(port or 5432)


@pytest.fixture(scope="session")
def pg_available() -> bool:
    """Whether the PostgreSQL server answers; CI starts it, so absence fails PG tests."""
    try:
        with socket.create_connection(_pg_host_port(), timeout=2):
            return True
    except OSError:
        return False


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _db_url(name: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def pg_template(pg_available: bool) -> Iterator[str]:
    """A migrated template database that each test clones (fast, isolated)."""
    if not pg_available:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}; .ci/run starts it")
    name = f"bullpen_tpl_{os.getpid()}"

    async def create() -> None:
        await _admin(f'DROP DATABASE IF EXISTS "{name}"')
        await _admin(f'CREATE DATABASE "{name}"')
        settings = Settings(database_url=_db_url(name), data_dir=Path("/nonexistent"))
        async with open_store(settings):
            pass

    _run_apart(create())
    yield name
    _run_apart(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _run_apart(coro: Coroutine[Any, Any, None]) -> None:
    # Session fixtures may be first requested from inside a test's running loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each contract test runs once per backend."""
    param: str = request.param
    return param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier, `postgres` and `serial` markers; the slowest tests first (tests/support/suite.py)."""
    suite.mark(items)


def _marked_settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("with_settings")
    if marker is None:
        return {}
    unknown = set(marker.kwargs) - set(Settings.model_fields)
    if unknown:
        raise pytest.UsageError(f"with_settings: unknown Settings fields {sorted(unknown)}")
    return dict(marker.kwargs)


@pytest.fixture
async def settings(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Settings]:
    """Settings for a fresh, migrated database of the requested backend.

    A test's `with_settings(...)` marker changes fields (validated, no environment read).
    """
    base: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "secret_key": "t" * 40,
        **FAST_SIM,
        "drain_grace_s": 1.0,  # a test's server stops promptly with runs in flight
        # Workspace providers in tests are simulators and listeners on 127.0.0.1: allowed as an
        # operator would allow an internal provider. Tests of the guard set their own list.
        "outbound_allow": "127.0.0.1/32",
        **_marked_settings(request),
    }
    if backend == "sqlite":
        yield Settings(**base)
        return
    template = request.getfixturevalue("pg_template")
    name = f"bullpen_t_{uuid.uuid4().hex[:12]}"
    await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield Settings(database_url=_db_url(name), **base)
    finally:
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    """A migrated store on the requested backend."""
    async with open_store(settings) as opened:
        yield opened


@dataclass
class RunningServer:
    """A Bullpen server on a real socket in this event loop."""

    base_url: str
    services: Services
    boot: Bootstrap
    settings: Settings

    @property
    def auth(self) -> dict[str, str]:
        """Headers that authenticate as the bootstrap admin's key."""
        return {"Authorization": f"Bearer {self.boot.api_key}"}


async def start_server(settings: Settings) -> tuple[uvicorn.Server, asyncio.Task[None], str]:
    """Serve create_app(settings) on an ephemeral port; returns (server, task, base URL)."""
    config = server_config(
        create_app(settings),
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


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[RunningServer]:
    """A bootstrapped server (API + worker + simulated provider) for this test."""
    async with open_store(settings) as st:
        boot = await ensure_bootstrap(
            st, load_secret(settings.secret_key, settings.data_dir), utcnow
        )
    srv, task, base_url = await start_server(settings)
    app = srv.config.app
    try:
        yield RunningServer(base_url, app.state.services, boot, settings)
    finally:
        srv.should_exit = True
        await asyncio.wait_for(task, 15)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client."""
    async with aiohttp.ClientSession() as session:
        yield session
