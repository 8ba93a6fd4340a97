"""Idempotency keys: the stored outcome of a create, scoped to (workspace, caller, route, key)."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.records.audit import IdempotencyRecord
from bullpen.store.base import Connection, upsert_insert
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

    def params(self) -> dict[str, Any]:
        """The bound values of `_SCOPE` for this scope."""
        return {
            "scope_workspace_id": self.workspace_id,
            "scope_principal": self.principal,
            "scope_route": self.route,
            "scope_key": self.key,
        }


_c = idempotency_keys.c
# The statements are built once (bound parameters only), so each use skips their construction.
_SCOPE = sa.and_(
    _c.workspace_id == sa.bindparam("scope_workspace_id"),
    _c.principal == sa.bindparam("scope_principal"),
    _c.route == sa.bindparam("scope_route"),
    _c.key == sa.bindparam("scope_key"),
)
_FIND = sa.select(idempotency_keys).where(_SCOPE)
# One row always (the lock's answer), with the stored outcome's columns when there is one. The
# row source is a literal subquery, not VALUES: a VALUES with data is not cached, and the
# statement was compiled afresh on every create (8 % of its CPU in a profile, issue 21).
_ONE = sa.select(sa.literal_column("1").label("one")).subquery("one")
_CLAIM = sa.select(
    sa.func.pg_try_advisory_xact_lock(sa.bindparam("lock_id", type_=sa.BigInteger)).label("locked"),
    *idempotency_keys.c,
).select_from(_ONE.outerjoin(idempotency_keys, _SCOPE))
_FORGET = idempotency_keys.delete().where(_SCOPE)


@functools.cache
def _store_statement(dialect: str) -> Any:
    return upsert_insert(dialect)(idempotency_keys).on_conflict_do_nothing()


async def claim(
    conn: Connection, scope: Scope, dialect: str
) -> tuple[bool, IdempotencyRecord | None]:
    """Hold the scope until the transaction ends and read its stored outcome, if any.

    Returns (False, None) when another transaction holds the scope. On PostgreSQL the advisory
    lock and the lookup are one round trip; an outcome committed by another transaction between
    the lookup's snapshot and the lock is caught when `store` finds the key taken. SQLite needs
    no lock: its single writer already serialises every write transaction.
    """
    if dialect != "postgresql":
        found = (await conn.execute(_FIND, scope.params())).first()
        return True, (IdempotencyRecord.of(found._mapping) if found is not None else None)
    row = (await conn.execute(_CLAIM, {**scope.params(), "lock_id": scope.lock_id()})).one()
    if not row.locked:
        return False, None
    return True, (IdempotencyRecord.of(row._mapping) if row.key is not None else None)


async def forget(conn: Connection, scope: Scope) -> None:
    """Drop this scope's stored outcome (it expired)."""
    await conn.execute(_FORGET, scope.params())


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
    result = await conn.execute(_store_statement(dialect), values)
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
