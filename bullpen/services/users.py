"""User use cases: the caller's own account and password, and instance admins managing users.

Passwords are hashed (argon2id, tens of milliseconds) on a worker thread and *before* any write
transaction opens, so no writer waits on a hash. Passwords and hashes never reach audit data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.principal import Principal, Role
from bullpen.domain.records.accounts import UserRecord
from bullpen.errors import Conflict, Forbidden, NotFound
from bullpen.services.auth import hash_password
from bullpen.store import audit, identity
from bullpen.store import users as user_store
from bullpen.store.base import Connection, Store
from bullpen.store.paging import Page

NO_USER = "this API key belongs to an agent, not a user; only people have an account"
EDITABLE = frozenset({"name", "disabled", "is_instance_admin"})


async def hash_new_password(password: str) -> str:
    """The argon2id hash of a new password, computed off the event loop."""
    return await asyncio.to_thread(hash_password, password)


def need_instance_admin(principal: Principal) -> None:
    """Refuse unless the caller is an instance admin (the API checks first)."""
    if not principal.is_instance_admin:
        raise Forbidden("only an instance admin may do this")


class UserService:
    """Reads and changes user accounts."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        verify_password: Callable[[UUID, str], Awaitable[bool]],
        hash_password: Callable[[str], Awaitable[str]] = hash_new_password,
    ) -> None:
        self._store = store
        self._clock = clock
        self._verify_password = verify_password
        self._hash_password = hash_password

    async def new_password_hash(self, password: str) -> str:
        """The hash a new password is stored as (on the password pool when given one)."""
        return await self._hash_password(password)

    async def me(self, principal: Principal) -> tuple[UserRecord, Role]:
        """The calling user and its role in the current workspace."""
        user_id = _user_of(principal)
        async with self._store.read() as conn:
            user = await user_store.get_user(conn, user_id)
        if user is None:
            raise NotFound("no such user")
        return user, principal.role

    async def change_password(self, principal: Principal, current: str, new: str) -> int:
        """Replace the caller's password and end all of its sessions; returns how many ended."""
        user_id = _user_of(principal)
        if not await self._verify_password(user_id, current):
            # One answer for every mismatch (wrong password, disabled account).
            raise Forbidden("the current password is not correct")
        password_hash = await self._hash_password(new)
        now = self._clock()
        async with self._store.write() as conn:
            await user_store.set_password_hash(conn, user_id, password_hash)
            ended = await identity.delete_user_sessions(conn, user_id)
            await audit.record_by(
                conn,
                principal,
                "user.password_change",
                "user",
                user_id,
                now,
                {"sessions_ended": ended},
            )
        return ended

    async def list(
        self, principal: Principal, *, limit: int, after: tuple[datetime, UUID] | None
    ) -> Page[UserRecord]:
        """A page of every user of the instance, oldest first."""
        need_instance_admin(principal)
        async with self._store.read() as conn:
            return await user_store.list_users(conn, limit=limit, after=after)

    async def get(self, principal: Principal, user_id: UUID) -> UserRecord:
        """One user of the instance."""
        need_instance_admin(principal)
        async with self._store.read() as conn:
            return await self._user(conn, user_id)

    async def create(
        self,
        principal: Principal,
        *,
        email: str,
        name: str,
        password_hash: str,
        is_instance_admin: bool,
    ) -> UserRecord:
        """Create a user (a member of no workspace yet); `password_hash` from new_password_hash."""
        need_instance_admin(principal)
        email = email.lower()
        now = self._clock()
        async with self._store.write() as conn:
            if await user_store.find_by_email(conn, email) is not None:
                raise Conflict("a user with this email already exists")
            user_id = await user_store.insert_user(
                conn,
                email=email,
                name=name,
                password_hash=password_hash,
                is_instance_admin=is_instance_admin,
                now=now,
            )
            # Instance-level (finding 10): not in whichever workspace the admin acts in.
            await audit.record_instance(
                conn,
                principal,
                "user.create",
                "user",
                user_id,
                now,
                {"email": email, "name": name, "is_instance_admin": is_instance_admin},
            )
            return await self._user(conn, user_id)

    async def update(
        self, principal: Principal, user_id: UUID, changes: dict[str, Any]
    ) -> UserRecord:
        """Rename, disable or enable, promote or demote a user; disabling ends its sessions."""
        need_instance_admin(principal)
        if not changes.keys() <= EDITABLE:
            raise Forbidden(f"only {sorted(EDITABLE)} may be changed")
        if user_id == principal.user_id and (
            changes.get("disabled") is True or changes.get("is_instance_admin") is False
        ):
            raise Conflict("you cannot disable yourself or remove your own instance admin role")
        now = self._clock()
        async with self._store.write() as conn:
            user = await user_store.lock_user(conn, user_id)
            if user is None:
                raise NotFound("no such user")
            before = _editable(user)
            after = {**before, **changes}
            changed = {k: v for k, v in after.items() if before[k] != v}
            if not changed:
                return user
            values = {k: v for k, v in changed.items() if k != "disabled"}
            if "disabled" in changed:
                values["disabled_at"] = now if changed["disabled"] else None
            await user_store.update_user(conn, user_id, values)
            data: dict[str, Any] = {
                "before": {k: before[k] for k in changed},
                "after": changed,
            }
            if changed.get("disabled"):
                # Their API keys stop at once too: key lookup skips disabled users.
                data["sessions_ended"] = await identity.delete_user_sessions(conn, user_id)
            await audit.record_instance(conn, principal, "user.update", "user", user_id, now, data)
            return await self._user(conn, user_id)

    async def _user(self, conn: Connection, user_id: UUID) -> UserRecord:
        user = await user_store.get_user(conn, user_id)
        if user is None:
            raise NotFound("no such user")
        return user


def _user_of(principal: Principal) -> UUID:
    if principal.user_id is None:
        raise NotFound(NO_USER)
    return principal.user_id


def _editable(user: UserRecord) -> dict[str, Any]:
    return {
        "name": user.name,
        "disabled": user.disabled_at is not None,
        "is_instance_admin": bool(user.is_instance_admin),
    }
