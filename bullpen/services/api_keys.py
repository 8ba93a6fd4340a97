"""API key use cases: create (shown once, stored as a digest), list, read, revoke.

A caller sees and revokes its own keys; `keys:admin` reaches every key of the workspace and may
create keys for agents. A new key never grants more than its creator holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from uuid import UUID

from bullpen.domain import tokens
from bullpen.domain.access import (
    AGENT_PERMISSIONS,
    ALL_SCOPES,
    ROLE_PERMISSIONS,
    Permission,
    need,
    parse_scopes,
)
from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import Principal
from bullpen.domain.records.accounts import ApiKeyRecord
from bullpen.errors import Conflict, Forbidden, InvalidInput, NotFound
from bullpen.store import agents as agent_store
from bullpen.store import api_keys as key_store
from bullpen.store import audit, identity
from bullpen.store import workspaces as ws_store
from bullpen.store.base import Connection, Store

LIST_MAX = 200
EXPIRY_MAX = timedelta(days=366)
LIMIT_MAX = 1_000_000_000  # requests or tokens per minute a key may be given


def _invalid(field: str, message: str, code: str) -> InvalidInput:
    return InvalidInput(
        message, errors=[{"location": "body", "field": field, "message": message, "code": code}]
    )


def _names(permissions: Iterable[Permission]) -> str:
    return ", ".join(f"`{p}`" for p in sorted(permissions))


class ApiKeyService:
    """Creates, lists and revokes API keys within the caller's workspace."""

    def __init__(self, store: Store, clock: Callable[[], datetime], secret: bytes) -> None:
        self._store = store
        self._clock = clock
        self._secret = secret

    async def list(self, principal: Principal) -> Sequence[ApiKeyRecord]:
        """The caller's own keys (every key of the workspace with `keys:admin`), newest first."""
        need(principal, Permission.KEYS_READ)
        admin = principal.can(Permission.KEYS_ADMIN)
        if not admin and principal.user_id is None:
            return []
        async with self._store.read() as conn:
            return await key_store.list_keys(
                conn,
                principal.workspace_id,
                user_id=None if admin else principal.user_id,
                limit=LIST_MAX,
            )

    async def get(self, principal: Principal, key_id: UUID) -> ApiKeyRecord:
        """One key the caller may see; any other is NotFound."""
        need(principal, Permission.KEYS_READ)
        async with self._store.read() as conn:
            return await self._visible(conn, principal, key_id)

    async def create(
        self,
        principal: Principal,
        *,
        name: str,
        scopes: Sequence[str],
        expires_at: datetime | None = None,
        agent_id: UUID | None = None,
        workspace_id: UUID | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
    ) -> tuple[ApiKeyRecord, str]:
        """A new key for the caller (or, with `keys:admin`, for an agent); returns (row, key).

        A key acts in one workspace: the caller's current one, or `workspace_id`, another
        workspace the calling user belongs to (finding 10), where it holds that role's powers.
        """
        need(principal, Permission.KEYS_WRITE)
        if agent_id is not None:
            need(principal, Permission.KEYS_ADMIN)
        elif principal.user_id is None:
            raise Forbidden("only a user can own an API key; use `agent_id` for an agent's key")
        target = principal.workspace_id if workspace_id is None else workspace_id
        elsewhere = target != principal.workspace_id
        if elsewhere and agent_id is not None:
            # Agents' keys are made from within the agent's workspace (switch there first).
            raise NotFound("no such agent in that workspace")
        if elsewhere and not principal.permissions >= ROLE_PERMISSIONS[principal.role]:
            # A scoped key must not mint a broader key somewhere else.
            raise Forbidden(
                "only a session or an unscoped key may create a key for another workspace"
            )
        _check_limits({"rpm_limit": rpm_limit, "tpm_limit": tpm_limit})
        now = self._clock()
        if expires_at is not None and not now < expires_at <= now + EXPIRY_MAX:
            raise _invalid(
                "expires_at", "must be in the future and at most 366 days ahead", "expires_at"
            )
        try:
            requested = parse_scopes(scopes)
        except ValueError as err:
            raise _invalid("scopes", str(err), "scopes") from err
        stored_scopes = [ALL_SCOPES] if requested is None else sorted(map(str, requested))
        key = tokens.new_api_key()
        async with self._store.write() as conn:
            if agent_id is not None:
                agent = await agent_store.get_agent(conn, principal.workspace_id, agent_id)
                if agent is None:
                    raise NotFound("no such agent in this workspace")
                if agent.status == AgentStatus.TERMINATED:
                    raise Conflict(f"agent {agent.name!r} is terminated")
                _check_grant(principal, requested, AGENT_PERMISSIONS)
                if requested is not None and not requested <= AGENT_PERMISSIONS:
                    raise Forbidden(
                        f"an agent's key can hold only {_names(AGENT_PERMISSIONS)}; "
                        f"not {_names(requested - AGENT_PERMISSIONS)}"
                    )
            elif elsewhere:
                assert principal.user_id is not None
                role = await ws_store.role_of(conn, target, principal.user_id)
                if role is None:
                    raise NotFound("no such workspace")
                grant = ROLE_PERMISSIONS[role]
                if requested is not None and not requested <= grant:
                    raise Forbidden(
                        f"a key cannot grant more than your role there holds: you lack "
                        f"{_names(requested - grant)}"
                    )
            else:
                _check_grant(principal, requested, ROLE_PERMISSIONS[principal.role])
            prefix = tokens.visible_prefix(key)
            key_id = await identity.create_api_key(
                conn,
                workspace_id=target,
                user_id=principal.user_id if agent_id is None else None,
                agent_id=agent_id,
                name=name,
                prefix=prefix,
                digest=tokens.digest(self._secret, key),
                scopes=stored_scopes,
                now=now,
                expires_at=expires_at,
                rpm_limit=rpm_limit,
                tpm_limit=tpm_limit,
            )
            # Recorded where the key acts (the creator is the caller, wherever it is).
            await audit.record(
                conn,
                workspace_id=target,
                actor_type=principal.actor_type,
                actor_id=principal.actor_id,
                action="api_key.create",
                target_type="api_key",
                target_id=key_id,
                now=now,
                data={
                    "name": name,
                    "prefix": prefix,
                    "scopes": stored_scopes,
                    "user_id": str(principal.user_id) if agent_id is None else None,
                    "agent_id": str(agent_id) if agent_id is not None else None,
                    "expires_at": expires_at.isoformat() if expires_at else None,
                    "rpm_limit": rpm_limit,
                    "tpm_limit": tpm_limit,
                },
            )
            row = await key_store.get_key(conn, target, key_id)
        if row is None:  # inserted in this very transaction
            raise NotFound("no such API key")
        return row, key

    async def set_limits(
        self, principal: Principal, key_id: UUID, changes: dict[str, int | None]
    ) -> ApiKeyRecord:
        """Change a key's relay limits (own keys: `keys:write`; others': `keys:admin`)."""
        need(principal, Permission.KEYS_WRITE)
        if not changes.keys() <= key_store.LIMITS:
            raise InvalidInput(f"only {sorted(key_store.LIMITS)} may be changed")
        _check_limits(changes)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._visible(conn, principal, key_id)
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if not changed:
                return before
            await key_store.set_limits(conn, principal.workspace_id, key_id, changed)
            await audit.record_by(
                conn,
                principal,
                "api_key.update",
                "api_key",
                key_id,
                now,
                {
                    "name": before.name,
                    "prefix": before.prefix,
                    "before": {k: getattr(before, k) for k in changed},
                    "after": changed,
                },
            )
            return await self._visible(conn, principal, key_id)

    async def revoke(self, principal: Principal, key_id: UUID) -> None:
        """Revoke a key at once (own keys: `keys:write`; others': `keys:admin`); idempotent."""
        need(principal, Permission.KEYS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            row = await self._visible(conn, principal, key_id)
            if not await key_store.revoke_key(conn, principal.workspace_id, key_id, now):
                return  # revoking twice is a no-op
            await audit.record_by(
                conn,
                principal,
                "api_key.revoke",
                "api_key",
                key_id,
                now,
                {
                    "name": row.name,
                    "prefix": row.prefix,
                    "user_id": str(row.user_id) if row.user_id else None,
                    "agent_id": str(row.agent_id) if row.agent_id else None,
                },
            )

    async def _visible(self, conn: Connection, principal: Principal, key_id: UUID) -> ApiKeyRecord:
        row = await key_store.get_key(conn, principal.workspace_id, key_id)
        own = row is not None and principal.user_id is not None and row.user_id == principal.user_id
        if row is None or not (own or principal.can(Permission.KEYS_ADMIN)):
            raise NotFound("no such API key")
        return row


def _check_limits(limits: dict[str, int | None]) -> None:
    """Relay limits are whole numbers from 1 to LIMIT_MAX, or None (no limit)."""
    for field, value in limits.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LIMIT_MAX
        ):
            raise _invalid(field, f"must be a whole number from 1 to {LIMIT_MAX}, or null", field)


def _check_grant(
    principal: Principal, requested: frozenset[Permission] | None, grant: frozenset[Permission]
) -> None:
    """Refuse a key that could do more than its creator may (no escalation).

    `grant` is what the new key's owner holds; `*` means all of it, so a scoped key (or a
    demoted user's key) cannot mint a key broader than itself.
    """
    wanted = grant if requested is None else requested
    missing = wanted - principal.permissions
    if missing:
        what = f"`{ALL_SCOPES}` means {_names(wanted)}" if requested is None else "it asks for"
        raise Forbidden(
            f"a key cannot grant more than its creator holds: {what}; you lack {_names(missing)}"
        )
