"""Shared fixtures: real SQLite and real PostgreSQL stores, and a real server on a socket.

Fixtures and hooks only: what tests import lives in tests/support/.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bullpen.app import open_store
from bullpen.settings import Settings
from bullpen.store.base import Store
from tests.support import suite
from tests.support.pgbouncer import PgBouncer, running_pgbouncer
from tests.support.postgres import PG_ADMIN_URL, admin, db_url, pg_host_port, run_apart
from tests.support.servers import (
    BACKENDS,
    FAST_SIM,
    RunningServer,
    marked_settings,
    serving,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier, `postgres` and `serial` markers; the slowest tests first (tests/support/suite.py)."""
    suite.mark(items)


@pytest.fixture(scope="session")
def pg_available() -> bool:
    """Whether the PostgreSQL server answers; CI starts it, so absence fails PG tests."""
    try:
        with socket.create_connection(pg_host_port(), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def pg_template(pg_available: bool) -> Iterator[str]:
    """A migrated template database that each test clones (fast, isolated); one per process,
    so each pytest-xdist worker has its own."""
    if not pg_available:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL}; .ci/run starts it")
    name = f"bullpen_tpl_{os.getpid()}"

    async def create() -> None:
        await admin(f'DROP DATABASE IF EXISTS "{name}"')
        await admin(f'CREATE DATABASE "{name}"')
        settings = Settings(database_url=db_url(name), data_dir=Path("/nonexistent"))
        async with open_store(settings):
            pass

    run_apart(create())
    yield name
    run_apart(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head that each SQLite test copies, as PostgreSQL tests
    clone `pg_template`: migrating from empty took 1.5-4 s a test on two busy cores. One per
    process. Migrating from empty is still tested: here, once a worker, and by the tests that
    open their own data directory (tests/integration/store/test_migration_log.py, the CLI's)."""
    directory = tmp_path_factory.mktemp("sqlite_template")

    async def create() -> None:
        async with open_store(Settings(data_dir=directory, secret_key="t" * 40)):
            pass  # closing checkpoints the WAL into the file and removes it

    run_apart(create())
    template = directory / "bullpen.db"
    assert template.is_file() and not (directory / "bullpen.db-wal").exists()
    return template


@pytest.fixture(scope="session")
def pgbouncer(pg_available: bool) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode before the PostgreSQL server; one per process."""
    with running_pgbouncer() as running:
        yield running


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each contract test runs once per backend."""
    param: str = request.param
    return param


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
        **marked_settings(request),
    }
    if backend == "sqlite":
        made = Settings(**base)
        path = Path(made.resolved_database_url.removeprefix("sqlite:///"))
        if made.is_sqlite and str(path) != ":memory:" and not path.exists():
            # The migrated template's copy: opening it migrates nothing (`sqlite_template`).
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield made
        return
    template = request.getfixturevalue("pg_template")
    name = f"bullpen_t_{uuid.uuid4().hex[:12]}"
    await admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        if backend == "pgbouncer":  # pooled URL for the store, direct one for LISTEN/NOTIFY
            bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
            yield Settings(
                database_url=bouncer.url(name),
                database_pooler="pgbouncer",
                database_direct_url=db_url(name),
                **base,
            )
        else:
            yield Settings(database_url=db_url(name), **base)
    finally:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[Store]:
    """A migrated store on the requested backend."""
    async with open_store(settings) as opened:
        yield opened


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[RunningServer]:
    """A bootstrapped server (API + worker + simulated provider) for this test."""
    async with serving(settings) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client."""
    async with aiohttp.ClientSession() as session:
        yield session
