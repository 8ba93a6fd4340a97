"""Idempotency keys: the stored outcome of a create, scoped to (workspace, caller, route, key)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from bullpen.store.base import Connection
from bullpen.store.tables import idempotency_keys


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose key it is: the same key value in another scope is a different key."""

    workspace_id: UUID
    principal: str
    route: str
    key: str

    def lock_id(self) -> int:
        """A signed 64-bit id for a PostgreSQL advisory lock on this scope."""
        text = f"{self.workspace_id}\0{self.principal}\0{self.route}\0{self.key}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)

    def where(self) -> sa.ColumnElement[bool]:
        """The row of this scope."""
        c = idempotency_keys.c
        return sa.and_(
            c.workspace_id == self.workspace_id,
            c.principal == self.principal,
            c.route == self.route,
            c.key == self.key,
        )


async def try_lock(conn: Connection, scope: Scope, dialect: str) -> bool:
    """Hold the scope until the transaction ends; False if another transaction holds it.

    SQLite needs nothing: its single writer already serialises every write transaction.
    """
    if dialect != "postgresql":
        return True
    result = await conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(scope.lock_id())))
    return bool(result.scalar_one())


async def find(conn: Connection, scope: Scope) -> Any | None:
    """The stored outcome of this scope, expired or not, or None."""
    return (await conn.execute(sa.select(idempotency_keys).where(scope.where()))).first()


async def forget(conn: Connection, scope: Scope) -> None:
    """Drop this scope's stored outcome (it expired)."""
    await conn.execute(idempotency_keys.delete().where(scope.where()))


async def store(
    conn: Connection,
    scope: Scope,
    *,
    dialect: str,
    fingerprint: bytes,
    status_code: int,
    headers: dict[str, str],
    body: bytes,
    now: datetime,
    expires_at: datetime,
) -> bool:
    """Record an outcome unless one exists; True if this call stored it."""
    values = {
        "workspace_id": scope.workspace_id,
        "principal": scope.principal,
        "route": scope.route,
        "key": scope.key,
        "fingerprint": fingerprint,
        "status_code": status_code,
        "headers": headers,
        "body": body,
        "created_at": now,
        "expires_at": expires_at,
    }
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(idempotency_keys)
    result = await conn.execute(insert.values(**values).on_conflict_do_nothing())
    return int(result.rowcount) == 1


async def delete_expired(conn: Connection, now: datetime, limit: int) -> int:
    """Delete up to `limit` expired outcomes; returns how many."""
    c = idempotency_keys.c
    doomed = (
        sa.select(c.workspace_id, c.principal, c.route, c.key)
        .where(c.expires_at <= now)
        .limit(limit)
    )
    result = await conn.execute(
        idempotency_keys.delete().where(
            sa.tuple_(c.workspace_id, c.principal, c.route, c.key).in_(doomed)
        )
    )
    return int(result.rowcount)
