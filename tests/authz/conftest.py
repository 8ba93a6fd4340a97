"""One server per backend for the whole matrix: worlds are reseeded, not databases."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from bullpen.app import open_store, utcnow
from bullpen.security.secrets import load_secret
from bullpen.services.bootstrap import ensure_bootstrap
from bullpen.settings import Settings
from tests.support.postgres import admin, db_url
from tests.support.servers import BACKENDS, FAST_SIM, RunningServer, start_server
from tests.support.world import MATRIX_SETTINGS


@pytest_asyncio.fixture(scope="module", params=BACKENDS, loop_scope="module")
async def matrix_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningServer]:
    """A server on a fresh database of each backend, shared by the module's tests."""
    base: dict[str, Any] = {
        "data_dir": tmp_path_factory.mktemp("matrix") / "data",
        "secret_key": "m" * 40,
        **FAST_SIM,
        **MATRIX_SETTINGS,
    }
    name = None
    if request.param == "postgres":
        template = request.getfixturevalue("pg_template")
        name = f"bullpen_m_{uuid.uuid4().hex[:12]}"
        await admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        base["database_url"] = db_url(name)
    settings = Settings(**base)
    try:
        async with open_store(settings) as st:
            boot = await ensure_bootstrap(
                st, load_secret(settings.secret_key, settings.data_dir), utcnow
            )
        srv, task, base_url = await start_server(settings)
        try:
            yield RunningServer(base_url, srv.config.app.state.services, boot, settings)
        finally:
            srv.should_exit = True
            await asyncio.wait_for(task, 15)
    finally:
        if name is not None:
            await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def matrix_http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client living as long as the module's server."""
    async with aiohttp.ClientSession() as session:
        yield session
