"""Run Alembic migrations to head on start and via `bullpen migrate`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection

from bullpen.store.base import Store

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x6270_6D69  # "bpmi": serialises concurrent migrators on PostgreSQL


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
    command.upgrade(alembic_config(connection), "head")


async def migrate(store: Store) -> None:
    """Bring the database schema to the newest revision."""
    await store.run_sync(_upgrade)
