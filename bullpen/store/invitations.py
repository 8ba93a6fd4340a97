"""Invitations to a workspace, addressed to an email (issue 19, finding 10).

A row is a pending invitation; accepting, declining or revoking deletes it. Expired rows are
ignored by every read and purged whenever the workspace invites again.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa

from bullpen.domain.principal import Role
from bullpen.domain.records.accounts import InvitationRecord
from bullpen.store.base import Connection
from bullpen.store.tables import invitations, workspaces

_WITH_WORKSPACE = sa.select(
    invitations,
    workspaces.c.name.label("workspace_name"),
    workspaces.c.slug.label("workspace_slug"),
).select_from(invitations.join(workspaces, workspaces.c.id == invitations.c.workspace_id))


async def purge_expired(conn: Connection, workspace_id: UUID, now: datetime) -> int:
    """Delete the workspace's expired invitations; returns how many."""
    result = await conn.execute(
        invitations.delete().where(
            invitations.c.workspace_id == workspace_id, invitations.c.expires_at <= now
        )
    )
    return int(result.rowcount)


async def count_pending(conn: Connection, workspace_id: UUID) -> int:
    """How many invitations the workspace has (call after `purge_expired`)."""
    query = (
        sa.select(sa.func.count())
        .select_from(invitations)
        .where(invitations.c.workspace_id == workspace_id)
    )
    return int((await conn.execute(query)).scalar_one())


async def upsert(
    conn: Connection,
    *,
    workspace_id: UUID,
    email: str,
    role: Role,
    invited_by_type: str,
    invited_by_id: UUID | None,
    now: datetime,
    expires_at: datetime,
) -> UUID:
    """Invite `email` (a new id each time: a renewed invitation replaces the old one)."""
    await conn.execute(
        invitations.delete().where(
            invitations.c.workspace_id == workspace_id, invitations.c.email == email
        )
    )
    invitation_id = uuid.uuid4()
    await conn.execute(
        invitations.insert().values(
            id=invitation_id,
            workspace_id=workspace_id,
            email=email,
            role=role.value,
            invited_by_type=invited_by_type,
            invited_by_id=invited_by_id,
            created_at=now,
            expires_at=expires_at,
        )
    )
    return invitation_id


async def get(
    conn: Connection, workspace_id: UUID, invitation_id: UUID, now: datetime
) -> InvitationRecord | None:
    """A live invitation of the workspace, or None."""
    query = _WITH_WORKSPACE.where(
        invitations.c.workspace_id == workspace_id,
        invitations.c.id == invitation_id,
        invitations.c.expires_at > now,
    )
    return _invitation((await conn.execute(query)).first())


async def list_for_workspace(
    conn: Connection, workspace_id: UUID, now: datetime, limit: int
) -> list[InvitationRecord]:
    """The workspace's live invitations, newest first."""
    query = (
        _WITH_WORKSPACE.where(
            invitations.c.workspace_id == workspace_id, invitations.c.expires_at > now
        )
        .order_by(invitations.c.created_at.desc(), invitations.c.id)
        .limit(limit)
    )
    return [InvitationRecord.of(row._mapping) for row in await conn.execute(query)]


async def list_for_email(
    conn: Connection, email: str, now: datetime, limit: int
) -> list[InvitationRecord]:
    """The live invitations addressed to this email, newest first."""
    query = (
        _WITH_WORKSPACE.where(invitations.c.email == email, invitations.c.expires_at > now)
        .order_by(invitations.c.created_at.desc(), invitations.c.id)
        .limit(limit)
    )
    return [InvitationRecord.of(row._mapping) for row in await conn.execute(query)]


async def get_for_email(
    conn: Connection, invitation_id: UUID, email: str, now: datetime
) -> InvitationRecord | None:
    """A live invitation addressed to this email, row-locked until commit, or None."""
    query = (
        sa.select(invitations)
        .where(
            invitations.c.id == invitation_id,
            invitations.c.email == email,
            invitations.c.expires_at > now,
        )
        .with_for_update()
    )
    return _invitation((await conn.execute(query)).first())


async def delete(conn: Connection, invitation_id: UUID) -> bool:
    """Delete an invitation; whether it existed."""
    result = await conn.execute(invitations.delete().where(invitations.c.id == invitation_id))
    return int(result.rowcount) > 0


def _invitation(row: sa.Row[Any] | None) -> InvitationRecord | None:
    return InvitationRecord.of(row._mapping) if row is not None else None
