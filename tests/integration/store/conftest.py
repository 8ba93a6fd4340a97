"""Fixtures of the store's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from tests.support.postgres import empty_store


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
    async with empty_store("bullpen_bare") as store:
        yield store
