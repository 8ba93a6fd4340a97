"""A tenant with one subject per role and one object of each type, for the authorization matrix.

Seeded straight through the store (no HTTP, no password hashing per user: every user shares
one argon2id hash computed once), so the matrix can afford a fresh world after each change.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.security.secrets import SecretBox
from bullpen.services.auth import hash_password
from bullpen.services.gateway import key_context
from bullpen.services.mcp_servers import header_context
from bullpen.store import agents as agent_store
from bullpen.store import budgets as budget_store
from bullpen.store import gateway as gateway_store
from bullpen.store import identity
from bullpen.store import invitations as invitation_store
from bullpen.store import mcp as mcp_store
from bullpen.store import routines as routine_store
from bullpen.store import tasks as task_store
from bullpen.store import workspaces as workspace_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import approvals, memberships, metadata, runs, tasks, users

PASSWORD = "correct horse battery staple"
PROMPT = "Analyze this dataset and extract key metrics"
USER_ROLES = ("owner", "admin", "member", "viewer", "instance_admin")
# The matrix's servers (tests/authz/conftest.py): no worker, no rate limit in the way.
MATRIX_SETTINGS: dict[str, Any] = {
    "worker_enabled": False,  # objects keep the state the matrix expects (queued, failed)
    "rate_limit_key_rps": 1e6,
    "rate_limit_key_burst": 1_000_000,
    "rate_limit_workspace_rps": 1e6,
    "rate_limit_workspace_burst": 1_000_000,
}


@functools.cache
def password_hash() -> str:
    """One argon2id hash shared by every seeded user (hashing is slow by design)."""
    return hash_password(PASSWORD)


@dataclass
class Credentials:
    """How a subject authenticates: an API key, and (for users) a session and its CSRF token."""

    api_key: str
    session_id: str | None = None
    csrf: str | None = None


@dataclass
class Tenant:
    """One workspace: its subjects (by role) and the objects routes act on (by placeholder)."""

    subjects: dict[str, Credentials] = field(default_factory=dict)
    objects: dict[str, str] = field(default_factory=dict)


async def seed_tenant(store: Store, secret: bytes, csrf: Any, now: datetime, label: str) -> Tenant:
    """A workspace with owner, admin, member, viewer, an instance admin, an agent, and objects."""
    tenant = Tenant()
    tag = f"{label}{uuid.uuid4().hex[:8]}"
    async with store.write() as conn:
        ws = await identity.create_workspace(
            conn, name=f"ws {tag}", slug=f"ws-{tag}", task_key="T", now=now
        )
        tenant.objects["workspace"] = str(ws)
        for role in USER_ROLES:
            user = await _user(conn, f"{role}-{tag}@example.test", now, role == "instance_admin")
            member_role = Role.MEMBER if role == "instance_admin" else Role(role)
            await identity.add_member(
                conn, workspace_id=ws, user_id=user, role=member_role, now=now
            )
            _, key = await _key(conn, secret, ws, user, None, now)
            session_id = tokens.new_session_id()
            await identity.create_session(
                conn,
                digest=tokens.digest(secret, session_id),
                user_id=user,
                workspace_id=ws,
                now=now,
                expires_at=now + timedelta(days=1),
            )
            tenant.subjects[role] = Credentials(key, session_id, csrf(session_id))
            tenant.objects[f"{role}_user"] = str(user)
        # A second member whose key and membership are the objects of key and member routes.
        other = await _user(conn, f"other-{tag}@example.test", now, False)
        await identity.add_member(conn, workspace_id=ws, user_id=other, role=Role.MEMBER, now=now)
        tenant.objects["member"] = str(other)
        tenant.objects["user"] = str(other)
        other_key, _ = await _key(conn, secret, ws, other, None, now)
        tenant.objects["key"] = str(other_key)
        loner = await _user(conn, f"loner-{tag}@example.test", now, False)
        tenant.objects["loner_email"] = f"loner-{tag}@example.test"
        tenant.objects["loner"] = str(loner)
        invitation = await invitation_store.upsert(
            conn,
            workspace_id=ws,
            email=f"loner-{tag}@example.test",
            role=Role.MEMBER,
            invited_by_type="user",
            invited_by_id=None,
            now=now,
            expires_at=now + timedelta(days=1),
        )
        tenant.objects["invitation"] = str(invitation)

        agent = await _agent(conn, ws, f"agent-{tag}", now)
        idle_agent = await _agent(conn, ws, f"idle-{tag}", now)
        tenant.objects["agent"] = str(agent)
        tenant.objects["idle_agent"] = str(idle_agent)
        _, agent_key = await _key(conn, secret, ws, None, agent, now)
        tenant.subjects["agent"] = Credentials(agent_key)

        task, run = await task_store.insert_task_with_run(
            conn,
            workspace_id=ws,
            agent_id=agent,
            title="t",
            prompt=PROMPT,
            creator_user_id=None,
            creator_key_id=None,
            now=now,
        )
        tenant.objects["task"] = str(task.id)
        tenant.objects["run"] = str(run.id)
        failed, failed_run = await task_store.insert_task_with_run(
            conn,
            workspace_id=ws,
            agent_id=agent,
            title="f",
            prompt=PROMPT,
            creator_user_id=None,
            creator_key_id=None,
            now=now,
        )
        await conn.execute(tasks.update().where(tasks.c.id == failed.id).values(status="failed"))
        await conn.execute(runs.update().where(runs.c.id == failed_run.id).values(status="failed"))
        tenant.objects["failed_task"] = str(failed.id)
        # A pending approval: the task of an agent that requires approval.
        gated = await _agent(conn, ws, f"gated-{tag}", now)
        await agent_store.update_agent(conn, ws, gated, {"requires_approval": True})
        held, _ = await task_store.insert_task_with_run(
            conn,
            workspace_id=ws,
            agent_id=gated,
            title="held",
            prompt=PROMPT,
            creator_user_id=None,
            creator_key_id=None,
            now=now,
        )
        approval = (
            await conn.execute(sa.select(approvals.c.id).where(approvals.c.task_id == held.id))
        ).scalar_one()
        tenant.objects["approval"] = str(approval)
        routine = await routine_store.create_routine(
            conn,
            {
                "workspace_id": ws,
                "name": f"routine-{tag}",
                "agent_id": agent,
                "cron": "0 9 * * 1-5",
                "timezone": "UTC",
                "prompt": PROMPT,
                "concurrency": "skip",
                "catch_up": "latest",
                "enabled": True,
                "next_fire_at": now + timedelta(days=1),
            },
            now,
        )
        tenant.objects["routine"] = str(routine)
        budget = await budget_store.insert(
            conn,
            {
                "workspace_id": ws,
                "scope": "agent",
                "agent_id": agent,
                "amount_usd": 10.0,
                "period": "month",
                "timezone": "UTC",
                "warn_percent": 80,
                "hard_stop": True,
                "period_start": now,
                "created_at": now,
                "updated_at": now,
            },
        )
        tenant.objects["budget"] = str(budget.id)
        await _gateway(conn, tenant, secret, ws, tag, now)
        await _mcp_servers(conn, tenant, secret, ws, tag, now)
    return tenant


async def drop_tenant(store: Store, tenant: Tenant) -> None:
    """Delete a tenant's workspace and those of its users who belong to no other workspace, so
    that reseeding does not grow the database (`fingerprint` reads all of it).

    The last request may still be settling in the server (a relayed call's ledger row and its
    rollups): on PostgreSQL that write and this delete can deadlock, and the delete, if it is
    the one PostgreSQL stops, is made again."""
    user_ids = [
        uuid.UUID(value)
        for name, value in tenant.objects.items()
        if name.endswith("_user") or name in ("member", "loner")
    ]
    for attempt in range(1, _DROP_ATTEMPTS + 1):
        try:
            async with store.write() as conn:
                await workspace_store.delete_workspace(conn, uuid.UUID(tenant.objects["workspace"]))
                still_member = sa.exists().where(memberships.c.user_id == users.c.id)
                await conn.execute(users.delete().where(users.c.id.in_(user_ids), ~still_member))
            return
        except sa.exc.DBAPIError as err:
            if attempt == _DROP_ATTEMPTS or getattr(err.orig, "sqlstate", None) != _DEADLOCK:
                raise


_DROP_ATTEMPTS = 3
_DEADLOCK = "40P01"  # PostgreSQL's deadlock_detected


async def _gateway(
    conn: Connection, tenant: Tenant, secret: bytes, ws: uuid.UUID, tag: str, now: datetime
) -> None:
    """A provider with a sealed key that a route uses, and an unused one."""
    box = SecretBox(secret)
    for placeholder in ("provider", "idle_provider"):
        provider_id = uuid.uuid4()
        await gateway_store.create_provider(
            conn,
            provider_id=provider_id,
            workspace_id=ws,
            values={
                "name": f"{placeholder}-{tag}",
                "base_url": "http://127.0.0.1:9/v1",
                "api_key_ciphertext": box.seal("sk-matrix-key", key_context(provider_id)),
                "api_key_hint": "sk-…-key",
                "models": [],
                "connect_timeout_s": 1.0,
                "ttft_timeout_s": 1.0,
                "idle_timeout_s": 1.0,
                "deadline_s": 10.0,
            },
            now=now,
        )
        tenant.objects[placeholder] = str(provider_id)
    route_id = await gateway_store.create_route(
        conn,
        workspace_id=ws,
        name=f"route-{tag}",
        chain=[{"provider": f"provider-{tag}", "model": "m"}],
        now=now,
    )
    tenant.objects["route"] = str(route_id)


async def _mcp_servers(
    conn: Connection, tenant: Tenant, secret: bytes, ws: uuid.UUID, tag: str, now: datetime
) -> None:
    """Two MCP servers with a sealed header on a closed loopback port (a test is a 502)."""
    box = SecretBox(secret)
    for placeholder in ("mcp_server", "idle_mcp_server"):
        server_id = uuid.uuid4()
        sealed = box.seal("Bearer matrix-header", header_context(server_id, "Authorization"))
        await mcp_store.create_server(
            conn,
            server_id=server_id,
            workspace_id=ws,
            values={
                "name": f"{placeholder.replace('_', '-')}-{tag}".lower()[:32],
                "transport": "http",
                "url": "http://127.0.0.1:9/mcp",
                "headers": {
                    "Authorization": {
                        "sealed": base64.b64encode(sealed).decode(),
                        "hint": "Bea…ader",
                    }
                },
                "command": None,
                "env": {},
                "timeout_s": 2.0,
            },
            now=now,
        )
        tenant.objects[placeholder] = str(server_id)


async def _user(conn: Connection, email: str, now: datetime, instance_admin: bool) -> uuid.UUID:
    return await identity.create_user(
        conn,
        email=email,
        name=email.split("@")[0],
        password_hash=password_hash(),
        is_instance_admin=instance_admin,
        now=now,
    )


async def _agent(conn: Connection, ws: uuid.UUID, name: str, now: datetime) -> uuid.UUID:
    return await agent_store.create_agent(
        conn,
        workspace_id=ws,
        name=name,
        title="",
        adapter="llm",
        config={"provider": "simulated", "model": "sim-1"},
        now=now,
    )


async def _key(
    conn: Connection,
    secret: bytes,
    ws: uuid.UUID,
    user: uuid.UUID | None,
    agent: uuid.UUID | None,
    now: datetime,
) -> tuple[uuid.UUID, str]:
    """An API key of the user or the agent: (key id, key)."""
    key = tokens.new_api_key()
    key_id = await identity.create_api_key(
        conn,
        workspace_id=ws,
        user_id=user,
        agent_id=agent,
        name="matrix",
        prefix=tokens.visible_prefix(key),
        digest=tokens.digest(secret, key),
        scopes=["*"],
        now=now,
    )
    return key_id, key


# Columns that change on a refused request by design: a key's last use is recorded when it
# authenticates, whatever the outcome.
_VOLATILE = {("api_keys", "last_used_at")}


async def fingerprint(store: Store) -> str:
    """A digest of every row that a refused request must leave alone (not the audit log)."""
    digest = hashlib.sha256()
    async with store.read() as conn:
        for table in metadata.sorted_tables:
            if table.name == "audit_events":
                continue
            columns = [c for c in table.c if (table.name, c.name) not in _VOLATILE]
            rows = await conn.execute(sa.select(*columns).order_by(*table.primary_key.columns))
            digest.update(table.name.encode())
            for row in rows:
                digest.update(repr(tuple(row)).encode())
    return digest.hexdigest()


def is_user(role: str) -> bool:
    """Whether a subject is a user (has a session) rather than an agent."""
    return role in USER_ROLES
