"""Workspaces, users, memberships, API keys and sessions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import UserLogin
from bullpen.store.base import Connection
from bullpen.store.tables import agents, api_keys, memberships, sessions, users, workspaces


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What authentication needs to know about an API key."""

    id: UUID
    workspace_id: UUID
    user_id: UUID | None
    agent_id: UUID | None
    role: Role
    scopes: list[str]
    is_instance_admin: bool
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    rpm_limit: int | None = None
    tpm_limit: int | None = None


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A signed-in browser session."""

    user_id: UUID
    workspace_id: UUID | None  # None: the user belongs to no workspace yet
    role: Role | None
    expires_at: datetime
    email: str
    is_instance_admin: bool


async def create_workspace(
    conn: Connection, *, name: str, slug: str, task_key: str, now: datetime
) -> UUID:
    """Insert a workspace and return its id."""
    ws_id = uuid.uuid4()
    await conn.execute(
        workspaces.insert().values(
            id=ws_id, name=name, slug=slug, task_key=task_key, task_counter=0, created_at=now
        )
    )
    return ws_id


async def create_user(
    conn: Connection,
    *,
    email: str,
    name: str,
    password_hash: str,
    is_instance_admin: bool,
    now: datetime,
) -> UUID:
    """Insert a user and return its id."""
    user_id = uuid.uuid4()
    await conn.execute(
        users.insert().values(
            id=user_id,
            email=email.lower(),
            name=name,
            password_hash=password_hash,
            is_instance_admin=is_instance_admin,
            created_at=now,
        )
    )
    return user_id


async def add_member(
    conn: Connection, *, workspace_id: UUID, user_id: UUID, role: Role, now: datetime
) -> None:
    """Give a user a role in a workspace."""
    await conn.execute(
        memberships.insert().values(
            workspace_id=workspace_id, user_id=user_id, role=role.value, created_at=now
        )
    )


async def create_api_key(
    conn: Connection,
    *,
    workspace_id: UUID,
    user_id: UUID | None,
    name: str,
    prefix: str,
    digest: bytes,
    scopes: list[str],
    now: datetime,
    expires_at: datetime | None = None,
    agent_id: UUID | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
) -> UUID:
    """Store a new API key (of a user, or of an agent) by its digest; never the key itself."""
    key_id = uuid.uuid4()
    await conn.execute(
        api_keys.insert().values(
            id=key_id,
            workspace_id=workspace_id,
            user_id=user_id,
            agent_id=agent_id,
            name=name,
            prefix=prefix,
            digest=digest,
            scopes=scopes,
            expires_at=expires_at,
            created_at=now,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
        )
    )
    return key_id


#: The tables a key's principal is read from, or whose deletes cascade to keys.
KEY_SOURCES = frozenset({"api_keys", "memberships", "users", "workspaces", "agents"})
_KEY_LOOKUP = (
    sa.select(
        api_keys.c.id,
        api_keys.c.workspace_id,
        api_keys.c.user_id,
        api_keys.c.agent_id,
        api_keys.c.expires_at,
        api_keys.c.revoked_at,
        api_keys.c.last_used_at,
        api_keys.c.scopes,
        api_keys.c.rpm_limit,
        api_keys.c.tpm_limit,
        memberships.c.role,
        users.c.is_instance_admin,
    )
    .select_from(
        api_keys.outerjoin(
            memberships,
            sa.and_(
                memberships.c.workspace_id == api_keys.c.workspace_id,
                memberships.c.user_id == api_keys.c.user_id,
            ),
        )
        .outerjoin(users, users.c.id == api_keys.c.user_id)
        .outerjoin(agents, agents.c.id == api_keys.c.agent_id)
    )
    .where(
        api_keys.c.digest == sa.bindparam("digest"),
        users.c.disabled_at.is_(None),
        # A terminated agent's keys are revoked with it; one that escaped (created in a race
        # with the termination) is refused all the same.
        sa.or_(api_keys.c.agent_id.is_(None), agents.c.status != AgentStatus.TERMINATED.value),
    )
)


async def find_api_key(conn: Connection, digest: bytes) -> KeyRecord | None:
    """The key with this digest, with its owner's role, or None."""
    row = (await conn.execute(_KEY_LOOKUP, {"digest": digest})).first()
    if row is None:
        return None
    # A user's key acts with the user's current role; an agent's key as a member.
    role = Role(row.role) if row.role is not None else Role.MEMBER
    if row.user_id is not None and row.role is None:
        return None  # the user left the workspace
    return KeyRecord(
        id=row.id,
        workspace_id=row.workspace_id,
        user_id=row.user_id,
        agent_id=row.agent_id,
        role=role,
        scopes=list(row.scopes),
        is_instance_admin=bool(row.is_instance_admin),
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        last_used_at=row.last_used_at,
        rpm_limit=row.rpm_limit,
        tpm_limit=row.tpm_limit,
    )


async def touch_api_key(conn: Connection, key_id: UUID, now: datetime) -> None:
    """Record that a key was used."""
    await conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(last_used_at=now))


async def find_user_for_login(conn: Connection, email: str) -> UserLogin | None:
    """The enabled user with this email (id, password_hash), or None."""
    row = (
        await conn.execute(
            sa.select(users.c.id, users.c.password_hash).where(
                users.c.email == email.lower(), users.c.disabled_at.is_(None)
            )
        )
    ).first()
    return UserLogin.of(row._mapping) if row is not None else None


async def password_hash(conn: Connection, user_id: UUID) -> str | None:
    """The enabled user's password hash, or None."""
    row = (
        await conn.execute(
            sa.select(users.c.password_hash).where(
                users.c.id == user_id, users.c.disabled_at.is_(None)
            )
        )
    ).first()
    return str(row.password_hash) if row else None


async def replace_password_hash(conn: Connection, user_id: UUID, old: str, new: str) -> bool:
    """Store `new` as the user's hash if `old` is still the stored one (a password changed
    meanwhile is kept); whether it was stored."""
    result = await conn.execute(
        users.update()
        .where(users.c.id == user_id, users.c.password_hash == old)
        .values(password_hash=new)
    )
    return int(result.rowcount) == 1


async def first_membership(conn: Connection, user_id: UUID) -> tuple[UUID, Role] | None:
    """The user's oldest workspace membership (the UI's default workspace)."""
    row = (
        await conn.execute(
            sa.select(memberships.c.workspace_id, memberships.c.role)
            .where(memberships.c.user_id == user_id)
            .order_by(memberships.c.created_at)
            .limit(1)
        )
    ).first()
    return (row.workspace_id, Role(row.role)) if row else None


async def create_session(
    conn: Connection,
    *,
    digest: bytes,
    user_id: UUID,
    workspace_id: UUID | None,
    now: datetime,
    expires_at: datetime,
) -> None:
    """Store a new browser session by the digest of its id (in no workspace: None)."""
    await conn.execute(
        sessions.insert().values(
            digest=digest,
            user_id=user_id,
            workspace_id=workspace_id,
            created_at=now,
            expires_at=expires_at,
        )
    )


async def find_session(conn: Connection, digest: bytes) -> SessionRecord | None:
    """The live session with this digest, with the user's role in its workspace, or None.

    The membership is checked on every request: a session whose workspace the user no longer
    belongs to is None. A session in no workspace (the user has none yet) has no role.
    """
    row = (
        await conn.execute(
            sa.select(
                sessions.c.user_id,
                sessions.c.workspace_id,
                sessions.c.expires_at,
                memberships.c.role,
                users.c.email,
                users.c.is_instance_admin,
            )
            .select_from(
                sessions.join(users, users.c.id == sessions.c.user_id).outerjoin(
                    memberships,
                    sa.and_(
                        memberships.c.user_id == sessions.c.user_id,
                        memberships.c.workspace_id == sessions.c.workspace_id,
                    ),
                )
            )
            .where(sessions.c.digest == digest, users.c.disabled_at.is_(None))
        )
    ).first()
    if row is None or (row.workspace_id is not None and row.role is None):
        return None
    return SessionRecord(
        user_id=row.user_id,
        workspace_id=row.workspace_id,
        role=Role(row.role) if row.role is not None else None,
        expires_at=row.expires_at,
        email=row.email,
        is_instance_admin=bool(row.is_instance_admin),
    )


async def set_session_workspace(conn: Connection, digest: bytes, workspace_id: UUID) -> bool:
    """Make a session act in another workspace; whether the session exists."""
    result = await conn.execute(
        sessions.update().where(sessions.c.digest == digest).values(workspace_id=workspace_id)
    )
    return int(result.rowcount) > 0


async def delete_session(conn: Connection, digest: bytes) -> None:
    """End a session."""
    await conn.execute(sessions.delete().where(sessions.c.digest == digest))


async def delete_user_sessions(conn: Connection, user_id: UUID) -> int:
    """End every session of a user (password change, disable); returns how many."""
    result = await conn.execute(sessions.delete().where(sessions.c.user_id == user_id))
    return int(result.rowcount)


async def delete_expired_sessions(conn: Connection, now: datetime, limit: int) -> int:
    """Delete up to `limit` expired sessions; returns how many."""
    doomed = sa.select(sessions.c.digest).where(sessions.c.expires_at <= now).limit(limit)
    result = await conn.execute(sessions.delete().where(sessions.c.digest.in_(doomed)))
    return int(result.rowcount)


async def count_users(conn: Connection) -> int:
    """How many users exist (zero means first start)."""
    return int((await conn.execute(sa.select(sa.func.count()).select_from(users))).scalar_one())
