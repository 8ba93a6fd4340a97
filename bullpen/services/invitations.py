"""Invitations: a workspace admin invites an email; its user accepts or declines (finding 10).

Inviting never reads the users table: the answer is the same whether or not the email has an
account, so an invitation cannot tell an admin which emails exist. The membership exists only
once the invited user (signed in, with that email) accepts; an invitation expires after
`invitation_ttl_s`. Every step is audited in the inviting workspace.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal, Role
from bullpen.domain.records.accounts import InvitationRecord, WorkspaceRecord
from bullpen.errors import Conflict, Forbidden, NotFound
from bullpen.store import audit, identity
from bullpen.store import invitations as invite_store
from bullpen.store import users as user_store
from bullpen.store import workspaces as ws_store
from bullpen.store.base import Store

LIST_MAX = 200
NO_INVITATION = "no such invitation"


class InvitationService:
    """Invites emails to the caller's workspace; lets an invited user accept or decline."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        ttl: timedelta,
        pending_max: int,
    ) -> None:
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._pending_max = pending_max

    async def invite(self, principal: Principal, *, email: str, role: Role) -> InvitationRecord:
        """Invite an email (renewing a pending invitation); the same answer for any email."""
        need(principal, Permission.MEMBERS_WRITE)
        if role is Role.OWNER and principal.role is not Role.OWNER:
            raise Forbidden("only an owner may grant the owner role")
        email = email.lower()
        now = self._clock()
        ws = principal.workspace_id
        async with self._store.write() as conn:
            await ws_store.lock_workspace(conn, ws)
            # Members are listed to every member already: saying so reveals nothing new.
            if await ws_store.is_member_email(conn, ws, email):
                raise Conflict("this email belongs to a member of the workspace already")
            await invite_store.purge_expired(conn, ws, now)
            if await invite_store.count_pending(conn, ws) >= self._pending_max:
                raise Conflict(
                    f"the workspace has {self._pending_max} pending invitations (the limit, "
                    "BULLPEN_INVITATIONS_MAX); revoke some or wait for them to expire"
                )
            invitation_id = await invite_store.upsert(
                conn,
                workspace_id=ws,
                email=email,
                role=role,
                invited_by_type=principal.actor_type,
                invited_by_id=principal.actor_id,
                now=now,
                expires_at=now + self._ttl,
            )
            await audit.record_by(
                conn,
                principal,
                "invitation.create",
                "invitation",
                invitation_id,
                now,
                {"email": email, "role": role.value},
            )
            row = await invite_store.get(conn, ws, invitation_id, now)
        if row is None:  # upserted in that very transaction
            raise NotFound(NO_INVITATION)
        return row

    async def pending(self, principal: Principal) -> list[InvitationRecord]:
        """The workspace's live invitations, newest first."""
        need(principal, Permission.MEMBERS_WRITE)
        async with self._store.read() as conn:
            return await invite_store.list_for_workspace(
                conn, principal.workspace_id, self._clock(), LIST_MAX
            )

    async def revoke(self, principal: Principal, invitation_id: UUID) -> None:
        """Withdraw a pending invitation of the workspace."""
        need(principal, Permission.MEMBERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            row = await invite_store.get(conn, principal.workspace_id, invitation_id, now)
            if row is None:
                raise NotFound(NO_INVITATION)
            await invite_store.delete(conn, invitation_id)
            await audit.record_by(
                conn,
                principal,
                "invitation.revoke",
                "invitation",
                invitation_id,
                now,
                {"email": row.email, "role": row.role.value},
            )

    async def mine(self, principal: Principal) -> list[InvitationRecord]:
        """The live invitations addressed to the calling user's email."""
        email = await self._email_of(principal)
        async with self._store.read() as conn:
            return await invite_store.list_for_email(conn, email, self._clock(), LIST_MAX)

    async def accept(
        self, principal: Principal, invitation_id: UUID
    ) -> tuple[WorkspaceRecord, Role]:
        """Join the inviting workspace with the invited role; returns (workspace, role)."""
        return await self._answer(principal, invitation_id, accept=True)

    async def decline(self, principal: Principal, invitation_id: UUID) -> None:
        """Refuse an invitation: it is deleted, nothing else changes."""
        await self._answer(principal, invitation_id, accept=False)

    async def _answer(
        self, principal: Principal, invitation_id: UUID, *, accept: bool
    ) -> tuple[WorkspaceRecord, Role]:
        email = await self._email_of(principal)
        user_id = principal.user_id
        assert user_id is not None  # _email_of refuses agents
        now = self._clock()
        async with self._store.write() as conn:
            row = await invite_store.get_for_email(conn, invitation_id, email, now)
            if row is None:
                raise NotFound(NO_INVITATION)
            ws = row.workspace_id
            await ws_store.lock_workspace(conn, ws)
            role = row.role
            await invite_store.delete(conn, invitation_id)
            if accept:
                held = await ws_store.role_of(conn, ws, user_id)
                if held is None:
                    await identity.add_member(
                        conn, workspace_id=ws, user_id=user_id, role=role, now=now
                    )
                else:
                    role = held  # already a member: the invitation is spent, the role kept
            # Recorded in the inviting workspace: its admins see who joined or declined.
            await audit.record(
                conn,
                workspace_id=ws,
                actor_type="user",
                actor_id=user_id,
                action="member.add" if accept else "invitation.decline",
                target_type="user" if accept else "invitation",
                target_id=user_id if accept else invitation_id,
                now=now,
                data={"email": email, "role": role.value, "invitation_id": str(invitation_id)},
            )
            workspace = await ws_store.get_workspace(conn, ws)
        if workspace is None:  # locked above, in this transaction
            raise NotFound("no such workspace")
        return workspace, role

    async def _email_of(self, principal: Principal) -> str:
        if principal.user_id is None:
            raise NotFound(NO_INVITATION)
        async with self._store.read() as conn:
            user = await user_store.get_user(conn, principal.user_id)
        if user is None:
            raise NotFound(NO_INVITATION)
        return user.email
