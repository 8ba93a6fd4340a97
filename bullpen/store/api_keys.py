"""API keys as their owners and admins see them: list, get, revoke, and keys for agents.

Creating a user's key and looking a key up by its digest live in `store.identity` (they are
what authentication needs); nothing here ever selects the digest.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.records.accounts import ApiKeyRecord, RevokedKey
from bullpen.store.base import Connection
from bullpen.store.tables import api_keys

_PUBLIC = sa.select(
    api_keys.c.id,
    api_keys.c.workspace_id,
    api_keys.c.user_id,
    api_keys.c.agent_id,
    api_keys.c.name,
    api_keys.c.prefix,
    api_keys.c.scopes,
    api_keys.c.created_at,
    api_keys.c.expires_at,
    api_keys.c.last_used_at,
    api_keys.c.revoked_at,
    api_keys.c.rpm_limit,
    api_keys.c.tpm_limit,
)
LIMITS = frozenset({"rpm_limit", "tpm_limit"})


async def list_keys(
    conn: Connection, workspace_id: UUID, *, user_id: UUID | None, limit: int
) -> list[ApiKeyRecord]:
    """The workspace's keys (only `user_id`'s when given), newest first, at most `limit`."""
    query = _PUBLIC.where(api_keys.c.workspace_id == workspace_id)
    if user_id is not None:
        query = query.where(api_keys.c.user_id == user_id)
    query = query.order_by(api_keys.c.created_at.desc(), api_keys.c.id.desc()).limit(limit)
    return [ApiKeyRecord.of(row._mapping) for row in await conn.execute(query)]


async def get_key(conn: Connection, workspace_id: UUID, key_id: UUID) -> ApiKeyRecord | None:
    """The key with this id in this workspace, or None (another workspace's is None too)."""
    row = (
        await conn.execute(
            _PUBLIC.where(api_keys.c.id == key_id, api_keys.c.workspace_id == workspace_id)
        )
    ).first()
    return ApiKeyRecord.of(row._mapping) if row is not None else None


async def set_limits(
    conn: Connection, workspace_id: UUID, key_id: UUID, changes: dict[str, int | None]
) -> None:
    """Change a key's relay limits (`rpm_limit`, `tpm_limit`; None is no limit)."""
    if not changes.keys() <= LIMITS:
        raise ValueError(f"not updatable: {sorted(changes.keys() - LIMITS)}")
    await conn.execute(
        api_keys.update()
        .where(api_keys.c.id == key_id, api_keys.c.workspace_id == workspace_id)
        .values(**changes)
    )


async def revoke_key(conn: Connection, workspace_id: UUID, key_id: UUID, now: datetime) -> bool:
    """Mark a live key revoked; False when it was already revoked (or is not there)."""
    result = await conn.execute(
        api_keys.update()
        .where(
            api_keys.c.id == key_id,
            api_keys.c.workspace_id == workspace_id,
            api_keys.c.revoked_at.is_(None),
        )
        .values(revoked_at=now)
    )
    return int(result.rowcount) == 1


async def revoke_agent_keys(
    conn: Connection, workspace_id: UUID, agent_id: UUID, now: datetime
) -> list[RevokedKey]:
    """Mark every live key of an agent revoked; the keys revoked (id, name, prefix)."""
    result = await conn.execute(
        api_keys.update()
        .where(
            api_keys.c.workspace_id == workspace_id,
            api_keys.c.agent_id == agent_id,
            api_keys.c.revoked_at.is_(None),
        )
        .values(revoked_at=now)
        .returning(api_keys.c.id, api_keys.c.name, api_keys.c.prefix)
    )
    return [RevokedKey.of(row._mapping) for row in result]
