"""Agent use cases: create, change, pause, delete, read.

Every change commits with its audit event in one transaction. An agent with tasks cannot be
deleted (their history refers to it): it is paused instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.principal import Principal
from bullpen.errors import Conflict, InvalidInput, NotFound
from bullpen.store import agents as agent_store
from bullpen.store import audit
from bullpen.store.base import Connection, Store

ADAPTERS = frozenset({"llm"})
SETTABLE_STATUSES = frozenset({"active", "paused"})
TERMINATED = "terminated"


def _check(adapter: str | None = None, status: str | None = None) -> None:
    if adapter is not None and adapter not in ADAPTERS:
        raise InvalidInput(f"adapter must be one of {sorted(ADAPTERS)}")
    if status is not None and status not in SETTABLE_STATUSES:
        raise InvalidInput(f"status must be one of {sorted(SETTABLE_STATUSES)}")


class AgentService:
    """Creates, changes and reads the agents of the caller's workspace."""

    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._clock = clock

    async def list(self, principal: Principal) -> Sequence[Any]:
        """The workspace's agents by name."""
        need(principal, Permission.AGENTS_READ)
        async with self._store.read() as conn:
            return await agent_store.list_agents(conn, principal.workspace_id)

    async def get(self, principal: Principal, agent_id: UUID) -> Any:
        """One agent; another workspace's is NotFound."""
        need(principal, Permission.AGENTS_READ)
        async with self._store.read() as conn:
            return await self._agent(conn, principal, agent_id)

    async def create(
        self,
        principal: Principal,
        *,
        name: str,
        title: str,
        adapter: str,
        config: dict[str, Any],
        max_concurrent_runs: int = 10,
        status: str = "active",
    ) -> Any:
        """Create an agent; a name already used in the workspace is Conflict."""
        need(principal, Permission.AGENTS_WRITE)
        _check(adapter, status)
        now = self._clock()
        async with self._store.write() as conn:
            agent_id = await agent_store.create_agent(
                conn,
                workspace_id=principal.workspace_id,
                name=name,
                title=title,
                adapter=adapter,
                config=config,
                now=now,
                status=status,
                max_concurrent_runs=max_concurrent_runs,
            )
            await audit.record_by(
                conn,
                principal,
                "agent.create",
                "agent",
                agent_id,
                now,
                {
                    "name": name,
                    "title": title,
                    "adapter": adapter,
                    "config": config,
                    "status": status,
                    "max_concurrent_runs": max_concurrent_runs,
                },
            )
            return await self._agent(conn, principal, agent_id)

    async def update(self, principal: Principal, agent_id: UUID, changes: dict[str, Any]) -> Any:
        """Change any of name, title, config, max_concurrent_runs, status (active or paused)."""
        need(principal, Permission.AGENTS_WRITE)
        if not changes.keys() <= agent_store.UPDATABLE:
            raise InvalidInput(f"only {sorted(agent_store.UPDATABLE)} may be changed")
        _check(status=changes.get("status"))
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._agent(conn, principal, agent_id)
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if "status" in changed and before.status == TERMINATED:
                raise Conflict("a terminated agent cannot be reactivated or paused")
            if not changed:
                return before
            await agent_store.update_agent(conn, principal.workspace_id, agent_id, changed)
            await audit.record_by(
                conn,
                principal,
                "agent.update",
                "agent",
                agent_id,
                now,
                {"before": {k: getattr(before, k) for k in changed}, "after": changed},
            )
            return await self._agent(conn, principal, agent_id)

    async def delete(self, principal: Principal, agent_id: UUID) -> None:
        """Delete an agent without tasks (its API keys go with it); else Conflict."""
        need(principal, Permission.AGENTS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            agent = await self._agent(conn, principal, agent_id)
            if await agent_store.has_tasks(conn, agent_id):
                raise Conflict(
                    f"agent {agent.name!r} has tasks and cannot be deleted; "
                    "pause it instead (PATCH its `status` to `paused`)"
                )
            await agent_store.delete_agent(conn, principal.workspace_id, agent_id)
            await audit.record_by(
                conn,
                principal,
                "agent.delete",
                "agent",
                agent_id,
                now,
                {"name": agent.name, "adapter": agent.adapter, "status": agent.status},
            )

    async def _agent(self, conn: Connection, principal: Principal, agent_id: UUID) -> Any:
        agent = await agent_store.get_agent(conn, principal.workspace_id, agent_id)
        if agent is None:
            raise NotFound("no such agent")
        return agent
