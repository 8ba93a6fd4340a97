"""SQLite runs inline on the event loop, so one process owns a data directory at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from bullpen.app import open_store
from bullpen.errors import BullpenError
from bullpen.settings import Settings


async def test_a_second_process_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, secret_key="s" * 40)
    async with open_store(settings):
        with pytest.raises(BullpenError, match="one process per SQLite data directory"):
            async with open_store(settings):
                pass
    async with open_store(settings) as again:  # released on close
        assert again.is_sqlite
