"""Engine construction for SQLite (WAL, used inline) and PostgreSQL (asyncpg pool)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine

from bullpen.errors import Unavailable
from bullpen.settings import Settings
from bullpen.store.base import WRITE_OPTION, Store

if TYPE_CHECKING:
    import asyncpg

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


def _idle_ms(settings: Settings) -> int:
    return max(1, round(settings.db_idle_transaction_timeout_s * 1000))


def _server_settings(settings: Settings) -> dict[str, str]:
    """Session settings of every PostgreSQL connection."""
    return {"idle_in_transaction_session_timeout": str(_idle_ms(settings))}


def _pooled_connection(idle_ms: int) -> type[asyncpg.Connection]:
    """An asyncpg connection whose every BEGIN also sets the idle-in-transaction timeout.

    A transaction-mode pooler refuses startup parameters it does not know and hands each
    transaction to whichever server connection is free, so session settings cannot be set
    once per connection. `SET LOCAL` rides in the BEGIN's own simple-query message (asyncpg's
    `Transaction.start` sends `BEGIN ...;` with `execute`): no extra round trip.
    """
    import asyncpg  # here, not at the top: a SQLite server never loads the driver

    suffix = f" SET LOCAL idle_in_transaction_session_timeout = {int(idle_ms)};"

    class PooledConnection(asyncpg.Connection):  # type: ignore[misc]
        # asyncpg's own signature, `timeout` included (Transaction.start calls this).
        async def execute(
            self,
            query: str,
            *args: Any,
            timeout: float | None = None,  # noqa: ASYNC109
        ) -> str:
            if not args and query.startswith("BEGIN") and query.endswith(";"):
                query += suffix
            result: str = await super().execute(query, *args, timeout=timeout)
            return result

    return PooledConnection


def _connect_args(settings: Settings) -> dict[str, Any]:
    """asyncpg's connect arguments: direct, or through a transaction-mode pooler."""
    if settings.database_pooler == "none":
        return {"server_settings": _server_settings(settings)}
    # PgBouncer 1.18 does not follow prepared statements from one transaction to the next
    # (1.21 does), so named, cached statements break. Unnamed ones with both caches off are
    # asyncpg's own PgBouncer path: each is parsed again with its Bind, in one message.
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _unnamed,
        "connection_class": _pooled_connection(_idle_ms(settings)),
    }


def _unnamed() -> str:
    return ""


def _connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
    """Connect; a pooler's refusal of our session settings says which settings to use."""
    try:
        return dialect.connect(*cargs, **cparams)
    except dialect.loaded_dbapi.Error as err:
        if "unsupported startup parameter" not in str(err):
            raise
        raise Unavailable(
            "the database refused a session setting at connect (unsupported startup"
            " parameter): a pooler in transaction mode such as PgBouncer needs"
            " BULLPEN_DATABASE_POOLER=pgbouncer and BULLPEN_DATABASE_DIRECT_URL"
            " (docs/operations.md, PgBouncer)"
        ) from err


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
    pg_engine = create_async_engine(
        url,
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
        pool_size=settings.pool_size,
        max_overflow=settings.pool_max_overflow,
        # No pre-ping: it costs a round trip per transaction; a dropped connection fails
        # its statement, is invalidated, and the caller gets a 503 to retry.
        pool_recycle=1800,
        connect_args=_connect_args(settings),
    )
    event.listen(pg_engine.sync_engine, "do_connect", _connect)
    return Store(pg_engine)
