"""Start-up migrations say one line: created, migrated from → to, or up to date."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from bullpen.settings import Settings
from bullpen.store.base import Store
from bullpen.store.engine import create_store
from bullpen.store.migrate import alembic_config, current_revision, migrate, newest_revision

HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What Bullpen's migrations logged (alembic's own lines are silenced by `logs.configure`)."""
    return [r.getMessage() for r in caplog.records if r.name == "bullpen.store.migrate"]


async def test_a_current_schema_says_so_in_one_line(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await migrate(store)
    assert said(caplog) == [f"database schema up to date ({HEAD})"]


@pytest.mark.parametrize("start", [None, "0007"])
async def test_a_migration_says_from_where_to_where_in_one_line(
    start: str | None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = create_store(Settings(data_dir=tmp_path / "data", secret_key="t" * 40))
    try:
        if start is not None:
            await store.run_sync(lambda c: command.upgrade(alembic_config(c), start))
        caplog.set_level(logging.INFO)
        await migrate(store)
        await migrate(store)
    finally:
        await store.close()
    assert HEAD is not None and HEAD.isdigit()  # revisions are numbered 0001, 0002, …
    if start is None:
        first = f"database schema created ({HEAD}, {int(HEAD)} revisions)"
    else:
        first = f"database schema migrated {start} → {HEAD} ({int(HEAD) - int(start)} revisions)"
    assert said(caplog) == [first, f"database schema up to date ({HEAD})"]


def test_the_newest_migration_file_is_alembics_head() -> None:
    """Start-up recognises a current schema by the newest file's revision, without Alembic."""
    assert newest_revision() == HEAD


async def test_a_current_schema_is_recognised_without_alembic(
    store: Store, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_alembic(*args: object, **kwargs: object) -> None:
        raise AssertionError("alembic ran for a schema already at its head")

    monkeypatch.setattr(command, "upgrade", no_alembic)
    caplog.set_level(logging.INFO)
    await migrate(store)
    assert said(caplog) == [f"database schema up to date ({HEAD})"]
    assert await store.run_sync(current_revision) == HEAD


async def test_a_database_at_an_unknown_revision_still_goes_to_alembic(
    store: Store, tmp_path: Path
) -> None:
    """A schema this code does not know (a newer release's) is Alembic's to refuse."""
    await store.run_sync(
        lambda c: c.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    )
    with pytest.raises(Exception, match="9999"):
        await migrate(store)
