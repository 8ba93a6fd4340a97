"""Rows the tests start from, written through the store's own functions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from bullpen.domain import tokens
from bullpen.domain.principal import Role
from bullpen.domain.runs import RunOutcome
from bullpen.domain.status import RunStatus
from bullpen.store import agents as agent_store
from bullpen.store import identity
from bullpen.store import runs as run_store
from bullpen.store import tasks as task_store
from bullpen.store.base import Connection, Store
from bullpen.store.tables import runs
from tests.support.servers import RunningServer

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


async def finished_run(
    store: Store,
    ws: uuid.UUID,
    agent: uuid.UUID,
    started: datetime,
    ttft_ms: float | None,
    *,
    cost_usd: float | None = None,
) -> uuid.UUID:
    """A task whose run started at `started` and ended done through the queue's own end
    (`runs.finish`, which counts `ttft_ms` in the latency histogram and writes the ledger row
    of a run with a cost); returns the run's id."""
    _, run_id = await new_task(store, ws, agent, started)
    async with store.write() as conn:
        await conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(status="running", attempt=1, started_at=started, lease_owner="test")
        )
        await run_store.finish(
            conn,
            run_id=run_id,
            attempt=1,
            outcome=RunOutcome(
                status=RunStatus.DONE,
                result="ok",
                error=None,
                first_token_at=None if ttft_ms is None else started,
                ttft_ms=ttft_ms,
                provider="sim",
                model="sim-1",
                input_tokens=10,
                output_tokens=5,
                cost_usd=cost_usd,
            ),
            now=started + timedelta(seconds=1),
        )
    return run_id


class Member(NamedTuple):
    """A user seeded into a workspace, and the API key it was given."""

    user_id: uuid.UUID
    key_id: uuid.UUID
    key: str


async def member_with_key(
    conn: Connection, ws: uuid.UUID, *, role: Role, secret: bytes, email: str, now: datetime
) -> tuple[uuid.UUID, str]:
    """A user with `role` in `ws` and an API key of theirs; returns (key id, key)."""
    _, key_id, key = await _member(conn, ws, role=role, secret=secret, email=email, now=now)
    return key_id, key


async def new_member(server: RunningServer, role: Role, email: str) -> Member:
    """A user with `role` in the server's default workspace, with an API key of theirs."""
    svc = server.services
    async with svc.store.write() as conn:
        return await _member(
            conn,
            server.boot.workspace_id,
            role=role,
            secret=svc.secret,
            email=email,
            now=svc.clock(),
        )


async def other_workspace(
    conn: Connection, *, secret: bytes, now: datetime, role: Role = Role.OWNER
) -> tuple[uuid.UUID, uuid.UUID, str]:
    """A second workspace, `other`, whose one user o@x.io holds `role` and an API key.

    Returns (workspace id, key id, key).
    """
    ws = await identity.create_workspace(conn, name="Other", slug="other", task_key="OT", now=now)
    key_id, key = await member_with_key(conn, ws, role=role, secret=secret, email="o@x.io", now=now)
    return ws, key_id, key


async def agent_key(server: RunningServer) -> str:
    """An API key of the server's bootstrap agent (no user behind it)."""
    svc = server.services
    key = tokens.new_api_key()
    async with svc.store.write() as conn:
        await identity.create_api_key(
            conn,
            user_id=None,
            workspace_id=server.boot.workspace_id,
            agent_id=server.boot.agent_id,
            name="agent",
            prefix=tokens.visible_prefix(key),
            digest=tokens.digest(svc.secret, key),
            scopes=["*"],
            now=svc.clock(),
        )
    return key


async def open_session(server: RunningServer, user_id: uuid.UUID) -> str:
    """A session of the user in the default workspace, written directly (no password check)."""
    svc = server.services
    session = tokens.new_session_id()
    async with svc.store.write() as conn:
        await identity.create_session(
            conn,
            digest=tokens.digest(svc.secret, session),
            user_id=user_id,
            workspace_id=server.boot.workspace_id,
            now=svc.clock(),
            expires_at=svc.clock() + timedelta(hours=1),
        )
    return session


async def _member(
    conn: Connection, ws: uuid.UUID, *, role: Role, secret: bytes, email: str, now: datetime
) -> Member:
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
    return Member(user, key_id, key)
