"""Engine construction for SQLite (WAL, one writer) and PostgreSQL (asyncpg pool)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from bullpen.settings import Settings


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def create_engine(settings: Settings) -> AsyncEngine:
    """Build the engine the store uses; nothing connects until first use."""
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        if ":memory:" not in url:
            settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        engine = create_async_engine(
            url,
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            connect_args={"check_same_thread": False},
        )
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        url,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_max_overflow,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


def create_admin_engine(url: str) -> AsyncEngine:
    """An unpooled engine for one-off administrative work (tests, bench)."""
    return create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
