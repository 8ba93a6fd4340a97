"""Rows the store tests start from, written through the store's own functions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def workspace_with_agent(store: Store, slug: str = "w1") -> tuple[uuid.UUID, uuid.UUID]:
    """A workspace and one `llm` agent in it."""
    async with store.write() as conn:
        ws = await identity.create_workspace(conn, name=slug, slug=slug, task_key="T", now=NOW)
        agent = await agent_store.create_agent(
            conn,
            workspace_id=ws,
            name="a",
            title="",
            adapter="llm",
            config={"provider": "simulated", "model": "sim-1"},
            now=NOW,
        )
    return ws, agent


async def insert_task(
    conn: Connection, ws: uuid.UUID, agent: uuid.UUID, when: datetime = NOW
) -> tuple[Any, Any]:
    """A queued task and its run, inside the caller's transaction."""
    return await task_store.insert_task_with_run(
        conn,
        workspace_id=ws,
        agent_id=agent,
        title="t",
        prompt="p" * 10,
        creator_user_id=None,
        creator_key_id=None,
        now=when,
    )


async def new_task(
    store: Store, ws: uuid.UUID, agent: uuid.UUID, when: datetime = NOW
) -> tuple[uuid.UUID, uuid.UUID]:
    """Commit a queued task and its run; returns (task id, run id)."""
    async with store.write() as conn:
        created, run = await insert_task(conn, ws, agent, when)
    return created.id, run.id


async def member_with_key(
    conn: Connection, ws: uuid.UUID, *, role: Role, secret: bytes, email: str, now: datetime
) -> tuple[uuid.UUID, str]:
    """A user with `role` in `ws` and an API key of theirs; returns (key id, key)."""
    key = tokens.new_api_key()
    user = await identity.create_user(
        conn, email=email, name=email, password_hash="x", is_instance_admin=False, now=now
    )
    await identity.add_member(conn, workspace_id=ws, user_id=user, role=role, now=now)
    key_id = await identity.create_api_key(
        conn,
        workspace_id=ws,
        user_id=user,
        name="k",
        prefix=tokens.visible_prefix(key),
        digest=tokens.digest(secret, key),
        scopes=["*"],
        now=now,
    )
    return key_id, key
