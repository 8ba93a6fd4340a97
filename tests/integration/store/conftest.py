"""Fixtures of the store's integration tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from tests.support.postgres import admin, db_url


@pytest.fixture(params=["sqlite", "postgres"])
async def bare(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A store on an empty database of its own (no migration run), for the migration tests
    that move it up and down themselves."""
    if request.param == "sqlite":
        store = create_store(Settings(data_dir=tmp_path))
        try:
            yield store
        finally:
            await store.close()
        return
    request.getfixturevalue("pg_available")
    name = f"bullpen_bare_{uuid.uuid4().hex[:12]}"
    await admin(f'CREATE DATABASE "{name}"')
    store = create_store(Settings(database_url=db_url(name), data_dir=Path("/nonexistent")))
    try:
        yield store
    finally:
        await store.close()
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
