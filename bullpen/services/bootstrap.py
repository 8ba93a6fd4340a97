"""First start: an admin, a workspace, an API key and a demo agent on the simulated provider."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.services.auth import hash_password
from bullpen.store import agents as agent_store
from bullpen.store import audit, identity
from bullpen.store import workspaces as ws_store
from bullpen.store.base import Connection, Store

ADMIN_EMAIL = "admin@bullpen.local"
DEMO_AGENT = "demo"
DEMO_AGENT_RUNS = 100  # runs of the demo agent at once
DEMO_AGENT_BREAKERS = {"runs_per_hour": None}  # its overrides of the breaker defaults
SIMULATED_PROVIDER = "simulated"
SIMULATED_MODEL = "sim-1"


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """What first start created; secrets are set only on the start that created them."""

    created: bool
    email: str
    password: str | None
    api_key: str | None
    workspace_id: UUID
    agent_id: UUID


async def ensure_bootstrap(store: Store, secret: bytes, clock: Callable[[], datetime]) -> Bootstrap:
    """Create the first admin, workspace, key and demo agent unless they exist."""
    async with store.read() as conn:
        if await identity.count_users(conn):
            return await _existing(conn)
    password = secrets.token_urlsafe(12)
    password_hash = await asyncio.to_thread(hash_password, password)
    api_key = tokens.new_api_key()
    now = clock()
    async with store.write() as conn:
        if await identity.count_users(conn):  # another process won the race
            return await _existing(conn)
        user_id = await identity.create_user(
            conn,
            email=ADMIN_EMAIL,
            name="Admin",
            password_hash=password_hash,
            is_instance_admin=True,
            now=now,
        )
        ws_id = await identity.create_workspace(
            conn, name="Default", slug="default", task_key="BP", now=now
        )
        await identity.add_member(
            conn, workspace_id=ws_id, user_id=user_id, role=Role.OWNER, now=now
        )
        await identity.create_api_key(
            conn,
            workspace_id=ws_id,
            user_id=user_id,
            name="first key",
            prefix=tokens.visible_prefix(api_key),
            digest=tokens.digest(secret, api_key),
            scopes=["*"],
            now=now,
        )
        agent_id = await agent_store.create_agent(
            conn,
            workspace_id=ws_id,
            name=DEMO_AGENT,
            title="Demo agent (simulated provider)",
            adapter="llm",
            config={"provider": SIMULATED_PROVIDER, "model": SIMULATED_MODEL},
            now=now,
            # The reference scenario's 80 users keep about 50 runs in flight: the demo agent
            # costs nothing, so its cap carries them (agents one creates start at 10).
            max_concurrent_runs=DEMO_AGENT_RUNS,
            # The same 80 users start ~30 runs/s (108,000 an hour) for as long as they run:
            # no run-rate breaker for it. Its runs cost nothing and do not fail, so the
            # failure and spend breakers keep their defaults.
            breakers=DEMO_AGENT_BREAKERS,
        )
        await audit.record(
            conn,
            workspace_id=ws_id,
            actor_type="system",
            actor_id=None,
            action="instance.bootstrap",
            target_type="workspace",
            target_id=ws_id,
            now=now,
            data={"admin_user_id": str(user_id), "agent_id": str(agent_id)},
        )
    return Bootstrap(True, ADMIN_EMAIL, password, api_key, ws_id, agent_id)


async def _existing(conn: Connection) -> Bootstrap:
    ws, agent_id, email = await ws_store.first_setup(conn)
    return Bootstrap(False, email, None, None, ws, agent_id)
