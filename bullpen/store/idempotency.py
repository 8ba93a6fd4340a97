"""Idempotency keys: the stored outcome of a create, scoped to (workspace, caller, route, key)."""

from __future__ import annotations

import functools
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
# Only the key's first outcome is kept: a conflicting insert stores nothing, unless the stored
# outcome has expired, which the new one replaces. On PostgreSQL an insert that meets the key
# of a transaction still in flight waits for it to end, so two requests with one key store
# one outcome between them.
_UPDATABLE = ("fingerprint", "status_code", "headers", "body", "created_at", "expires_at")


@functools.cache
def _store_statement(dialect: str) -> Any:
    insert = upsert_insert(dialect)(idempotency_keys)
    return insert.on_conflict_do_update(
        index_elements=[_c.workspace_id, _c.principal, _c.route, _c.key],
        set_={name: insert.excluded[name] for name in _UPDATABLE},
        where=_c.expires_at <= insert.excluded.created_at,
    )


async def find(conn: Connection, scope: Scope) -> IdempotencyRecord | None:
    """The scope's stored outcome, if any (expired or not)."""
    found = (await conn.execute(_FIND, scope.params())).first()
    return IdempotencyRecord.of(found._mapping) if found is not None else None


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
    """Record an outcome unless one that has not expired by `now` exists; True if this call
    stored it."""
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
