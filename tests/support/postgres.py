"""The PostgreSQL server the tests use: its admin URL, databases by name, admin statements.

Databases are named per process or per test (`bullpen_tpl_<pid>`, `bullpen_t_<uuid>`), so
pytest-xdist workers never share one.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.engine import create_store

PG_ADMIN_URL = os.environ.get("BULLPEN_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pg_host_port() -> tuple[str, int]:
    """The server's host and port, from PG_ADMIN_URL."""
    rest = PG_ADMIN_URL.split("@", 1)[1].split("/", 1)[0]
    host, _, port = rest.partition(":")
    return host, int(port or 5432)


async def admin(sql: str) -> None:
    """Run one statement on the admin database (CREATE/DROP DATABASE ...)."""
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def db_url(name: str) -> str:
    """The URL of database `name` on the same server."""
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return f"{base}/{name}"


@asynccontextmanager
async def empty_store(prefix: str) -> AsyncIterator[Store]:
    """A store on an empty PostgreSQL database of its own (no migration run), named
    `<prefix>_<hex>`, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await admin(f'CREATE DATABASE "{name}"')
    store = create_store(Settings(database_url=db_url(name), data_dir=Path("/nonexistent")))
    try:
        yield store
    finally:
        await store.close()
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_apart(coro: Coroutine[Any, Any, None]) -> None:
    """Run `coro` to completion in a loop of its own: session fixtures may be first requested
    from inside a test's running loop."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()
