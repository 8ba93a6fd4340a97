"""Who may do what: permissions, what each role grants, and API key scopes.

A caller's effective permissions are its role's permissions, narrowed by its API key's scopes
(a session has no scopes: it acts with the full role). Every API route names the one permission
it needs; `tests/authz/matrix.toml` is the independent statement of the outcome per role.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from bullpen.domain.principal import Principal, Role
from bullpen.errors import Forbidden


class Permission(StrEnum):
    """One thing a caller may do in its workspace; also the vocabulary of API key scopes."""

    WORKSPACE_READ = "workspace:read"
    WORKSPACE_WRITE = "workspace:write"
    WORKSPACE_DELETE = "workspace:delete"
    MEMBERS_READ = "members:read"
    MEMBERS_WRITE = "members:write"
    KEYS_READ = "keys:read"  # own keys
    KEYS_WRITE = "keys:write"  # create and revoke own keys
    KEYS_ADMIN = "keys:admin"  # everyone's keys, and agents' keys
    AGENTS_READ = "agents:read"
    AGENTS_WRITE = "agents:write"
    TASKS_READ = "tasks:read"
    TASKS_WRITE = "tasks:write"
    AUDIT_READ = "audit:read"
    PROVIDERS_READ = "providers:read"  # providers (never their keys) and model routes
    PROVIDERS_WRITE = "providers:write"
    LLM_USE = "llm:use"  # call models through the relay, spending the workspace's money
    COSTS_READ = "costs:read"  # the cost ledger's totals and series, and budgets
    BUDGETS_WRITE = "budgets:write"
    APPROVALS_DECIDE = "approvals:decide"  # approve or deny (members marked approver too)


ALL_SCOPES = "*"

_VIEWER = frozenset(
    {
        Permission.WORKSPACE_READ,
        Permission.MEMBERS_READ,
        Permission.KEYS_READ,
        Permission.KEYS_WRITE,
        Permission.AGENTS_READ,
        Permission.TASKS_READ,
        Permission.PROVIDERS_READ,
        Permission.COSTS_READ,
    }
)
_MEMBER = _VIEWER | {Permission.TASKS_WRITE, Permission.LLM_USE}
_ADMIN = _MEMBER | {
    Permission.WORKSPACE_WRITE,
    Permission.MEMBERS_WRITE,
    Permission.KEYS_ADMIN,
    Permission.AGENTS_WRITE,
    Permission.AUDIT_READ,
    Permission.PROVIDERS_WRITE,
    Permission.BUDGETS_WRITE,
    Permission.APPROVALS_DECIDE,
}
_OWNER = _ADMIN | {Permission.WORKSPACE_DELETE}

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.VIEWER: _VIEWER,
    Role.MEMBER: frozenset(_MEMBER),
    Role.ADMIN: frozenset(_ADMIN),
    Role.OWNER: frozenset(_OWNER),
}

# An agent's key acts like a member that cannot manage its own keys.
AGENT_PERMISSIONS: frozenset[Permission] = frozenset(
    {
        Permission.WORKSPACE_READ,
        Permission.MEMBERS_READ,
        Permission.AGENTS_READ,
        Permission.TASKS_READ,
        Permission.TASKS_WRITE,
        Permission.PROVIDERS_READ,
        Permission.LLM_USE,
    }
)

ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


def parse_scopes(scopes: Iterable[str]) -> frozenset[Permission] | None:
    """Scopes as permissions (None means every permission); raises ValueError on unknown ones."""
    values = list(scopes)
    if ALL_SCOPES in values:
        if len(values) > 1:
            raise ValueError(f"{ALL_SCOPES!r} cannot be combined with other scopes")
        return None
    return frozenset(Permission(value) for value in values)


def effective(
    granted: frozenset[Permission], scopes: frozenset[Permission] | None
) -> frozenset[Permission]:
    """What a caller may do: its grant narrowed by its key's scopes."""
    return granted if scopes is None else granted & scopes


def need(principal: Principal, permission: Permission) -> None:
    """Refuse unless the caller holds `permission` (the API checks first; the UI relies on it)."""
    if not principal.can(permission):
        raise Forbidden(f"this needs the `{permission}` permission")
