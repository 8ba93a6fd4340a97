"""Workspace and membership use cases.

A caller acts in one workspace (`principal.workspace_id`): another workspace is NotFound, never
Forbidden. Every change commits with its audit event in one transaction. Membership changes
lock the workspace row first, so two concurrent demotions cannot both pass the last-owner check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal, Role
from bullpen.domain.records.accounts import MemberRecord, MembershipRecord, WorkspaceRecord
from bullpen.errors import Conflict, Forbidden, NotFound
from bullpen.store import audit, identity
from bullpen.store import workspaces as ws_store
from bullpen.store.base import Connection, Store
from bullpen.store.paging import Page


@dataclass(frozen=True, slots=True)
class Membership:
    """A workspace the caller can act in, with its role there."""

    id: UUID
    name: str
    slug: str
    task_key: str
    role: Role
    current: bool


class WorkspaceService:
    """Creates, changes and deletes workspaces, and manages who is a member with which role."""

    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock

    async def mine(self, principal: Principal) -> list[Membership]:
        """The caller's workspaces: a user's memberships; an agent's key only its own."""
        async with self._store.read() as conn:
            if principal.user_id is None:
                row = await ws_store.get_workspace(conn, principal.workspace_id)
                rows: list[tuple[WorkspaceRecord | MembershipRecord, Role]] = (
                    [(row, principal.role)] if row is not None else []
                )
            else:
                found = await ws_store.memberships_of(conn, principal.user_id)
                rows = [(entry, entry.role) for entry in found]
        return [
            Membership(
                id=row.id,
                name=row.name,
                slug=row.slug,
                task_key=row.task_key,
                role=role,
                current=row.id == principal.workspace_id,
            )
            for row, role in rows
        ]

    async def create(
        self, principal: Principal, *, name: str, slug: str, task_key: str
    ) -> WorkspaceRecord:
        """Create a workspace whose owner is the calling instance admin."""
        if not principal.is_instance_admin or principal.user_id is None:
            raise Forbidden("only an instance admin may create workspaces")
        now = self._clock()
        async with self._store.write() as conn:
            if await ws_store.slug_taken(conn, slug):
                raise Conflict(f"the slug {slug!r} is already in use")
            ws_id = await ws_store.insert_workspace(
                conn, name=name, slug=slug, task_key=task_key, now=now
            )
            await identity.add_member(
                conn, workspace_id=ws_id, user_id=principal.user_id, role=Role.OWNER, now=now
            )
            # Recorded in the new workspace, so its own log starts with who created it.
            await audit.record(
                conn,
                workspace_id=ws_id,
                actor_type=principal.actor_type,
                actor_id=principal.actor_id,
                action="workspace.create",
                target_type="workspace",
                target_id=ws_id,
                now=now,
                data={
                    "name": name,
                    "slug": slug,
                    "task_key": task_key,
                    "from_workspace_id": str(principal.workspace_id),
                },
            )
            await audit.record_instance(
                conn,
                principal,
                "workspace.create",
                "workspace",
                ws_id,
                now,
                {"name": name, "slug": slug, "task_key": task_key},
            )
            row = await ws_store.get_workspace(conn, ws_id)
        if row is None:  # inserted in that very transaction
            raise NotFound("no such workspace")
        return row

    async def membership(self, principal: Principal, workspace_id: UUID) -> Membership:
        """The caller's membership of a workspace it may switch to; any other is NotFound.

        An API key is bound to the workspace it was created for (a switch to it is a no-op);
        a user's key for another workspace is created with `workspace_id`.
        """
        async with self._store.read() as conn:
            if principal.user_id is not None and principal.via == "session":
                role = await ws_store.role_of(conn, workspace_id, principal.user_id)
            elif workspace_id == principal.workspace_id:
                role = principal.role
            else:
                role = None
                if principal.user_id is not None:
                    role = await ws_store.role_of(conn, workspace_id, principal.user_id)
                if role is not None:
                    raise Conflict(
                        "an API key acts only in the workspace it was created for; create a "
                        "key for this workspace (`POST /api/v1/api-keys` with `workspace_id`)"
                    )
            row = await ws_store.get_workspace(conn, workspace_id) if role else None
        if row is None or role is None:
            raise NotFound("no such workspace")
        return Membership(
            id=row.id,
            name=row.name,
            slug=row.slug,
            task_key=row.task_key,
            role=role,
            current=True,
        )

    async def get(self, principal: Principal, workspace_id: UUID) -> WorkspaceRecord:
        """The caller's current workspace; any other id is NotFound."""
        need(principal, Permission.WORKSPACE_READ)
        async with self._store.read() as conn:
            return await self._workspace(conn, principal, workspace_id)

    async def update(
        self, principal: Principal, workspace_id: UUID, changes: dict[str, Any]
    ) -> WorkspaceRecord:
        """Rename the workspace (only `name` may change)."""
        need(principal, Permission.WORKSPACE_WRITE)
        if not changes.keys() <= {"name"}:
            raise Forbidden("only `name` may be changed")
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._workspace(conn, principal, workspace_id)
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if not changed:
                return before
            await ws_store.update_workspace(conn, workspace_id, changed)
            await audit.record_by(
                conn,
                principal,
                "workspace.update",
                "workspace",
                workspace_id,
                now,
                {"before": {k: getattr(before, k) for k in changed}, "after": changed},
            )
            return await self._workspace(conn, principal, workspace_id)

    async def delete(self, principal: Principal, workspace_id: UUID) -> None:
        """Delete the workspace and everything in it, unless a worker is running one of its runs.

        A running run's worker would keep writing events for rows that no longer exist; the
        caller cancels those tasks first (queued runs are simply deleted).
        """
        need(principal, Permission.WORKSPACE_DELETE)
        now = self._clock()
        async with self._store.write() as conn:
            row = await self._workspace(conn, principal, workspace_id, lock=True)
            running = await ws_store.running_runs(conn, workspace_id)
            if running:
                raise Conflict(
                    f"{running} run(s) of this workspace are running; cancel their tasks and "
                    "delete the workspace once they have stopped"
                )
            deleted = await ws_store.delete_workspace(conn, workspace_id)
            # audit_events.workspace_id has no foreign key: this record outlives the workspace.
            await audit.record_by(
                conn,
                principal,
                "workspace.delete",
                "workspace",
                workspace_id,
                now,
                {"name": row.name, "slug": row.slug, "deleted": deleted},
            )

    async def members(
        self, principal: Principal, *, limit: int, after: tuple[datetime, UUID] | None
    ) -> Page[MemberRecord]:
        """A page of the workspace's members, oldest membership first."""
        need(principal, Permission.MEMBERS_READ)
        async with self._store.read() as conn:
            return await ws_store.list_members(
                conn, principal.workspace_id, limit=limit, after=after
            )

    async def member(self, principal: Principal, user_id: UUID) -> MemberRecord:
        """One member of the workspace."""
        need(principal, Permission.MEMBERS_READ)
        async with self._store.read() as conn:
            return await self._member(conn, principal, user_id)

    async def change_role(self, principal: Principal, user_id: UUID, role: Role) -> MemberRecord:
        """Give a member another role; owners alone touch the owner role, and one must remain."""
        need(principal, Permission.MEMBERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            await ws_store.lock_workspace(conn, principal.workspace_id)
            member = await self._member(conn, principal, user_id)
            current = Role(member.role)
            if Role.OWNER in (current, role) and principal.role is not Role.OWNER:
                raise Forbidden("only an owner may change an owner's role or grant the owner role")
            if current is role:
                return member
            if (
                current is Role.OWNER
                and await ws_store.count_owners(conn, principal.workspace_id) <= 1
            ):
                raise Conflict(
                    "this is the workspace's last owner; make another member owner first"
                )
            await ws_store.set_role(conn, principal.workspace_id, user_id, role)
            await audit.record_by(
                conn,
                principal,
                "member.update",
                "user",
                user_id,
                now,
                {"before": {"role": current.value}, "after": {"role": role.value}},
            )
            return await self._member(conn, principal, user_id)

    async def set_approver(
        self, principal: Principal, user_id: UUID, approver: bool
    ) -> MemberRecord:
        """Mark a member as one who may decide approvals, or not (audited when it changes)."""
        need(principal, Permission.MEMBERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            member = await self._member(conn, principal, user_id)
            if member.approver is approver:
                return member
            await ws_store.set_approver(conn, principal.workspace_id, user_id, approver)
            await audit.record_by(
                conn,
                principal,
                "member.update",
                "user",
                user_id,
                now,
                {"before": {"approver": member.approver}, "after": {"approver": approver}},
            )
            return await self._member(conn, principal, user_id)

    async def remove_member(self, principal: Principal, user_id: UUID) -> None:
        """End a membership with its sessions and keys there; admins cannot remove owners."""
        need(principal, Permission.MEMBERS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            await ws_store.lock_workspace(conn, principal.workspace_id)
            member = await self._member(conn, principal, user_id)
            role = Role(member.role)
            if role is Role.OWNER:
                if principal.role is not Role.OWNER:
                    raise Forbidden("only an owner may remove an owner")
                if await ws_store.count_owners(conn, principal.workspace_id) <= 1:
                    raise Conflict("this is the workspace's last owner; it cannot be removed")
            sessions, keys = await ws_store.remove_member(
                conn, principal.workspace_id, user_id, now
            )
            await audit.record_by(
                conn,
                principal,
                "member.remove",
                "user",
                user_id,
                now,
                {
                    "email": member.email,
                    "role": role.value,
                    "sessions_ended": sessions,
                    "keys_revoked": keys,
                },
            )

    async def _workspace(
        self, conn: Connection, principal: Principal, workspace_id: UUID, *, lock: bool = False
    ) -> WorkspaceRecord:
        row = None
        if workspace_id == principal.workspace_id:
            find = ws_store.lock_workspace if lock else ws_store.get_workspace
            row = await find(conn, workspace_id)
        if row is None:
            raise NotFound("no such workspace")
        return row

    async def _member(self, conn: Connection, principal: Principal, user_id: UUID) -> MemberRecord:
        member = await ws_store.get_member(conn, principal.workspace_id, user_id)
        if member is None:
            raise NotFound("no such member in this workspace")
        return member
