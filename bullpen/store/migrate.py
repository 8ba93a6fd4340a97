"""Run Alembic migrations to head on start and via `bullpen migrate`."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from bullpen.store.base import Store

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x6270_6D69  # "bpmi": serialises concurrent migrators on PostgreSQL

log = logging.getLogger(__name__)


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    config = alembic_config(connection)
    before = MigrationContext.configure(connection).get_current_revision()
    command.upgrade(config, "head")
    # One line a start, whatever alembic did (its own per-revision lines are silenced by
    # bullpen.logs).
    script = ScriptDirectory.from_config(config)
    head = script.get_current_head()
    applied = sum(1 for _ in script.iterate_revisions(head, before or "base"))
    revisions = f"{applied} revision{'' if applied == 1 else 's'}"
    if before == head:
        log.info("database schema up to date (%s)", head)
    elif before is None:
        log.info("database schema created (%s, %s)", head, revisions)
    else:
        log.info("database schema migrated %s → %s (%s)", before, head, revisions)


async def migrate(store: Store) -> None:
    """Bring the database schema to the newest revision."""
    await store.run_sync(_upgrade)
