"""Workspaces and memberships: reads, changes, and deleting a workspace with all it holds.

Inserting a workspace or a membership reuses `store.identity` (bootstrap needs them too).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy import exc

from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import MemberRecord, MembershipRecord, WorkspaceRecord
from bullpen.domain.status import RunStatus
from bullpen.errors import Conflict
from bullpen.store import identity
from bullpen.store.base import Connection
from bullpen.store.paging import Page, keyset
from bullpen.store.tables import (
    agents,
    api_keys,
    approvals,
    idempotency_keys,
    invitations,
    memberships,
    run_events,
    runs,
    sessions,
    task_changes,
    task_comments,
    tasks,
    users,
    workspaces,
)

_MEMBER = sa.select(
    memberships.c.user_id,
    users.c.email,
    users.c.name,
    memberships.c.role,
    memberships.c.created_at,
    memberships.c.approver,
    users.c.disabled_at,
).select_from(memberships.join(users, users.c.id == memberships.c.user_id))

# Children first: tasks and runs reference agents without ON DELETE, and a run's events must
# go before the run. Whatever else carries a workspace_id follows the workspace by cascade.
_WORKSPACE_CHILDREN = (
    approvals,
    task_changes,  # no foreign key: a hot workspace row would gain a lock per status change
    run_events,
    runs,
    task_comments,
    tasks,
    api_keys,
    agents,
    sessions,
    memberships,
    idempotency_keys,
    invitations,
)


async def insert_workspace(
    conn: Connection, *, name: str, slug: str, task_key: str, now: datetime
) -> UUID:
    """Insert a workspace; a slug already in use is a Conflict (also under a race)."""
    try:
        return await identity.create_workspace(
            conn, name=name, slug=slug, task_key=task_key, now=now
        )
    except exc.IntegrityError as err:
        raise Conflict(f"the slug {slug!r} is already in use") from err


async def slug_taken(conn: Connection, slug: str) -> bool:
    """Whether some workspace already has this slug."""
    query = sa.select(workspaces.c.id).where(workspaces.c.slug == slug)
    return (await conn.execute(query)).first() is not None


async def get_workspace(conn: Connection, workspace_id: UUID) -> WorkspaceRecord | None:
    """The workspace, or None."""
    query = sa.select(workspaces).where(workspaces.c.id == workspace_id)
    row = (await conn.execute(query)).first()
    return WorkspaceRecord.of(row._mapping) if row is not None else None


async def lock_workspace(conn: Connection, workspace_id: UUID) -> WorkspaceRecord | None:
    """The workspace, row-locked until commit: serialises membership changes (PostgreSQL)."""
    query = sa.select(workspaces).where(workspaces.c.id == workspace_id).with_for_update()
    row = (await conn.execute(query)).first()
    return WorkspaceRecord.of(row._mapping) if row is not None else None


async def update_workspace(conn: Connection, workspace_id: UUID, values: dict[str, Any]) -> None:
    """Change a workspace's editable fields."""
    await conn.execute(workspaces.update().where(workspaces.c.id == workspace_id).values(**values))


async def memberships_of(conn: Connection, user_id: UUID) -> list[MembershipRecord]:
    """The user's workspaces with the role held in each, oldest membership first."""
    query = (
        sa.select(
            workspaces.c.id,
            workspaces.c.name,
            workspaces.c.slug,
            workspaces.c.task_key,
            memberships.c.role,
        )
        .select_from(memberships.join(workspaces, workspaces.c.id == memberships.c.workspace_id))
        .where(memberships.c.user_id == user_id)
        .order_by(memberships.c.created_at, workspaces.c.id)
    )
    return [MembershipRecord.of(row._mapping) for row in await conn.execute(query)]


async def list_members(
    conn: Connection, workspace_id: UUID, *, limit: int, after: tuple[datetime, UUID] | None
) -> Page[MemberRecord]:
    """A page of members, oldest first, keyset-paginated on (created_at, user_id)."""
    c = memberships.c
    query = _MEMBER.where(c.workspace_id == workspace_id)
    page = await keyset(
        conn, query, c.created_at, c.user_id, limit=limit, after=after, newest_first=False
    )
    return page.map(lambda row: MemberRecord.of(row._mapping))


async def get_member(conn: Connection, workspace_id: UUID, user_id: UUID) -> MemberRecord | None:
    """The user's membership of this workspace (with email and name), or None."""
    query = _MEMBER.where(
        memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id
    )
    row = (await conn.execute(query)).first()
    return MemberRecord.of(row._mapping) if row is not None else None


async def role_of(conn: Connection, workspace_id: UUID, user_id: UUID) -> Role | None:
    """The user's role in the workspace, or None when it is not a member."""
    query = sa.select(memberships.c.role).where(
        memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id
    )
    role = (await conn.execute(query)).scalar_one_or_none()
    return Role(role) if role is not None else None


async def is_member_email(conn: Connection, workspace_id: UUID, email: str) -> bool:
    """Whether the user with this email is a member (one query, whether or not it exists)."""
    query = _MEMBER.where(memberships.c.workspace_id == workspace_id, users.c.email == email)
    return (await conn.execute(query)).first() is not None


async def count_owners(conn: Connection, workspace_id: UUID) -> int:
    """How many owners the workspace has."""
    query = (
        sa.select(sa.func.count())
        .select_from(memberships)
        .where(memberships.c.workspace_id == workspace_id, memberships.c.role == Role.OWNER.value)
    )
    return int((await conn.execute(query)).scalar_one())


async def set_role(conn: Connection, workspace_id: UUID, user_id: UUID, role: Role) -> None:
    """Give a member another role."""
    await conn.execute(
        memberships.update()
        .where(memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id)
        .values(role=role.value)
    )


async def set_approver(conn: Connection, workspace_id: UUID, user_id: UUID, approver: bool) -> None:
    """Mark a member as one who may decide approvals, or not."""
    await conn.execute(
        memberships.update()
        .where(memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id)
        .values(approver=approver)
    )


async def is_approver(conn: Connection, workspace_id: UUID, user_id: UUID) -> bool:
    """Whether the user is a member marked approver."""
    query = sa.select(memberships.c.approver).where(
        memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id
    )
    return bool((await conn.execute(query)).scalar_one_or_none())


async def remove_member(
    conn: Connection, workspace_id: UUID, user_id: UUID, now: datetime
) -> tuple[int, int]:
    """End a membership, its sessions and its API keys there; returns (sessions, keys) ended.

    Keys are revoked, not merely orphaned: re-adding the user later must not revive them.
    """
    await conn.execute(
        memberships.delete().where(
            memberships.c.workspace_id == workspace_id, memberships.c.user_id == user_id
        )
    )
    ended = await conn.execute(
        sessions.delete().where(
            sessions.c.workspace_id == workspace_id, sessions.c.user_id == user_id
        )
    )
    revoked = await conn.execute(
        api_keys.update()
        .where(
            api_keys.c.workspace_id == workspace_id,
            api_keys.c.user_id == user_id,
            api_keys.c.revoked_at.is_(None),
        )
        .values(revoked_at=now)
    )
    return int(ended.rowcount), int(revoked.rowcount)


async def running_runs(conn: Connection, workspace_id: UUID) -> int:
    """How many of the workspace's runs a worker holds, after row-locking its live runs.

    The lock (PostgreSQL; SQLite has one writer) keeps a worker from claiming a queued run
    between this check and the delete that follows in the same transaction.
    """
    live = [RunStatus.QUEUED.value, RunStatus.RUNNING.value]
    query = (
        sa.select(runs.c.status)
        .where(runs.c.workspace_id == workspace_id, runs.c.status.in_(live))
        .with_for_update()
    )
    statuses = (await conn.execute(query)).scalars().all()
    return sum(1 for status in statuses if status == RunStatus.RUNNING.value)


async def delete_workspace(conn: Connection, workspace_id: UUID) -> dict[str, int]:
    """Delete the workspace and everything in it; returns rows deleted per table."""
    counts: dict[str, int] = {}
    for table in _WORKSPACE_CHILDREN:
        result = await conn.execute(table.delete().where(table.c.workspace_id == workspace_id))
        counts[str(table.name)] = int(result.rowcount)
    await conn.execute(workspaces.delete().where(workspaces.c.id == workspace_id))
    return counts


async def first_setup(conn: Connection) -> tuple[UUID, UUID, str]:
    """What the first start set up: the oldest workspace, its oldest agent, and the oldest
    instance admin's email."""
    ws = (
        await conn.execute(sa.select(workspaces.c.id).order_by(workspaces.c.created_at).limit(1))
    ).scalar_one()
    agent_id = (
        await conn.execute(
            sa.select(agents.c.id)
            .where(agents.c.workspace_id == ws)
            .order_by(agents.c.created_at)
            .limit(1)
        )
    ).scalar_one()
    email = (
        await conn.execute(
            sa.select(users.c.email)
            .where(users.c.is_instance_admin.is_(True))
            .order_by(users.c.created_at)
            .limit(1)
        )
    ).scalar_one()
    return ws, agent_id, email
