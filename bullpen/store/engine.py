"""Engine construction for SQLite (WAL, used inline) and PostgreSQL (asyncpg pool)."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from bullpen.settings import Settings
from bullpen.store.base import WRITE_OPTION, Store

# Connections are never held across an await, so a few suffice; a short timeout turns a
# misuse (holding one while suspended) into an error instead of a stalled event loop.
_SQLITE_POOL_SIZE = 4
_SQLITE_POOL_TIMEOUT_S = 2.0


def _json_dumps(value: Any) -> str:
    # Every run event's data passes through here: orjson is several times faster than json.
    return orjson.dumps(value).decode()


def _sqlite_connect(dbapi_connection: Any, _record: Any, wal_limit: int) -> None:
    # Let SQLAlchemy, not the driver, decide when transactions begin (see _sqlite_begin).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # A writer that starts the log over cuts the file back to this (finding 11b).
    cursor.execute(f"PRAGMA journal_size_limit={int(wal_limit)}")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=5000")
    # Checkpoints run on a worker thread (Store._checkpoint_loop), never on the event loop.
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    mode = "IMMEDIATE" if conn.get_execution_options().get(WRITE_OPTION) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


def _server_settings(settings: Settings) -> dict[str, str]:
    """Session settings of every PostgreSQL connection."""
    idle_ms = max(1, round(settings.db_idle_transaction_timeout_s * 1000))
    return {"idle_in_transaction_session_timeout": str(idle_ms)}


def create_store(settings: Settings) -> Store:
    """Build the store; nothing connects until first use."""
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        if path != ":memory:":
            settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        engine = sa.create_engine(
            url,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
            pool_size=_SQLITE_POOL_SIZE,
            max_overflow=0,
            pool_timeout=_SQLITE_POOL_TIMEOUT_S,
            connect_args={"check_same_thread": False},
        )
        wal_limit = settings.sqlite_wal_limit_mb * 1024 * 1024
        event.listen(engine, "connect", functools.partial(_sqlite_connect, wal_limit=wal_limit))
        event.listen(engine, "begin", _sqlite_begin)
        return Store(engine, sqlite_path=path, wal_limit_bytes=wal_limit)
    return Store(
        create_async_engine(
            url,
            json_serializer=_json_dumps,
            json_deserializer=orjson.loads,
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            # No pre-ping: it costs a round trip per transaction; a dropped connection fails
            # its statement, is invalidated, and the caller gets a 503 to retry.
            pool_recycle=1800,
            connect_args={"server_settings": _server_settings(settings)},
        )
    )
