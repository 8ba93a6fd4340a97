"""Users as admins see them: list, get, create, change; nothing here selects a password hash.

Sign-in lookups (by email with the hash) live in `store.identity`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.records.accounts import UserRecord
from bullpen.errors import Conflict
from bullpen.store import identity
from bullpen.store.base import Connection
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import users

_PUBLIC = sa.select(
    users.c.id,
    users.c.email,
    users.c.name,
    users.c.is_instance_admin,
    users.c.disabled_at,
    users.c.created_at,
)


async def insert_user(
    conn: Connection,
    *,
    email: str,
    name: str,
    password_hash: str,
    is_instance_admin: bool,
    now: datetime,
) -> UUID:
    """Insert a user; an email already in use is a Conflict (also under a race)."""
    try:
        return await identity.create_user(
            conn,
            email=email,
            name=name,
            password_hash=password_hash,
            is_instance_admin=is_instance_admin,
            now=now,
        )
    except exc.IntegrityError as err:
        raise Conflict("a user with this email already exists") from err


async def get_user(conn: Connection, user_id: UUID) -> UserRecord | None:
    """The user, or None."""
    return _user((await conn.execute(_PUBLIC.where(users.c.id == user_id))).first())


async def find_by_email(conn: Connection, email: str) -> UserRecord | None:
    """The user with this email (any case), or None."""
    return _user((await conn.execute(_PUBLIC.where(users.c.email == email.lower()))).first())


async def list_users(
    conn: Connection, *, limit: int, after: tuple[datetime, UUID] | None
) -> Page[UserRecord]:
    """A page of users, oldest first, keyset-paginated on (created_at, id)."""
    page = await keyset(
        conn, _PUBLIC, users.c.created_at, users.c.id, limit=limit, after=after, newest_first=False
    )
    return page.map(lambda row: UserRecord.of(row._mapping))


async def lock_user(conn: Connection, user_id: UUID) -> UserRecord | None:
    """The user, row-locked until commit (PostgreSQL; SQLite has one writer), or None."""
    query = _PUBLIC.where(users.c.id == user_id).with_for_update()
    return _user((await conn.execute(query)).first())


async def update_user(conn: Connection, user_id: UUID, values: dict[str, Any]) -> None:
    """Change a user's name, disabled_at or is_instance_admin."""
    await conn.execute(users.update().where(users.c.id == user_id).values(**values))


async def set_password_hash(conn: Connection, user_id: UUID, password_hash: str) -> None:
    """Replace a user's password hash."""
    await conn.execute(
        users.update().where(users.c.id == user_id).values(password_hash=password_hash)
    )


def _user(row: sa.Row[Any] | None) -> UserRecord | None:
    return UserRecord.of(row._mapping) if row is not None else None
