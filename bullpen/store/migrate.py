"""Run Alembic migrations to head on start and via `bullpen migrate`.

A database already at the newest revision, every start but the first after an upgrade, is
recognised without Alembic: its `alembic_version` row is compared with the newest migration
file's revision. Alembic (and Mako, and every migration module) is imported only when there is
something to migrate, which keeps about 10 MB of memory and a fraction of a second of start
out of every process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy import text
from sqlalchemy.engine import Connection

from bullpen.store.base import Store

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x6270_6D69  # "bpmi": serialises concurrent migrators on PostgreSQL

log = logging.getLogger(__name__)


def newest_revision() -> str:
    """The newest migration's revision. Each file is `<revision>_<slug>.py` with revisions
    numbered in order (tests/integration/store/test_migration_log.py checks this against
    Alembic's own head)."""
    versions = (MIGRATIONS / "versions").glob("[0-9]*_*.py")
    return max(path.name.split("_", 1)[0] for path in versions)


def current_revision(connection: Connection) -> str | None:
    """The database's revision, without Alembic; None for a database never migrated."""
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return found[0] if len(found) == 1 else None


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    newest = newest_revision()
    if current_revision(connection) == newest:
        log.info("database schema up to date (%s)", newest)
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

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
