"""Agent use cases: create, change, pause, resume, terminate, delete, read, the org chart.

Every change commits with its audit event in one transaction. An agent with tasks cannot be
deleted (their history refers to it): it is paused or terminated instead. The org chart
(`reports_to`) stays a forest within one workspace: a change that would make a cycle is refused,
and on PostgreSQL org chart changes of a workspace are serialised so two concurrent ones cannot
make a cycle together.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from bullpen.agents.configs import ConfigPolicy, public_config
from bullpen.domain.access import Permission, need
from bullpen.domain.agents import AgentStatus
from bullpen.domain.breakers import KEYS as BREAKER_KEYS
from bullpen.domain.breakers import BreakerLimits
from bullpen.domain.principal import Principal
from bullpen.domain.records import AgentRecord
from bullpen.errors import AgentTerminated, Conflict, InvalidInput, NotFound
from bullpen.store import activity as activity_store
from bullpen.store import agents as agent_store
from bullpen.store import api_keys as key_store
from bullpen.store import audit
from bullpen.store import breakers as breaker_store
from bullpen.store.activity import AgentActivity
from bullpen.store.base import Connection, Store

ADAPTERS = frozenset({"llm", "http", "process"})
SETTABLE_STATUSES = frozenset({AgentStatus.ACTIVE.value, AgentStatus.PAUSED.value})


def _check(adapter: str | None = None, status: str | None = None) -> None:
    if adapter is not None and adapter not in ADAPTERS:
        raise InvalidInput(f"adapter must be one of {sorted(ADAPTERS)}")
    if status is not None and status not in SETTABLE_STATUSES:
        raise InvalidInput(f"status must be one of {sorted(SETTABLE_STATUSES)}")


class AgentService:
    """Creates, changes and reads the agents of the caller's workspace."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        configs: ConfigPolicy,
        breakers: BreakerLimits | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._configs = configs
        self.breaker_defaults = breakers or BreakerLimits()

    def limits(self, agent: AgentRecord) -> BreakerLimits:
        """The breaker limits that apply to an agent: the defaults with its overrides."""
        return self.breaker_defaults.with_overrides(agent.breakers)

    async def list(self, principal: Principal) -> Sequence[AgentRecord]:
        """The workspace's agents by name."""
        need(principal, Permission.AGENTS_READ)
        async with self._store.read() as conn:
            return await agent_store.list_agents(conn, principal.workspace_id)

    async def names(self, principal: Principal) -> dict[UUID, str]:
        """The workspace's agents' names by id."""
        need(principal, Permission.AGENTS_READ)
        async with self._store.read() as conn:
            return await agent_store.agent_names(conn, principal.workspace_id)

    async def activity(self, principal: Principal, start: datetime) -> dict[UUID, AgentActivity]:
        """Each agent's runs started at or after `start`: count, success, TTFT, cost."""
        need(principal, Permission.AGENTS_READ)
        async with self._store.read() as conn:
            return await activity_store.since(conn, principal.workspace_id, start)

    async def get(self, principal: Principal, agent_id: UUID) -> AgentRecord:
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
        config: BaseModel,
        max_concurrent_runs: int = 10,
        status: str = AgentStatus.ACTIVE,
        description: str = "",
        reports_to: UUID | None = None,
        requires_approval: bool = False,
        approval_ttl_s: int | None = None,
        approval_default: str | None = None,
        breakers: dict[str, Any] | None = None,
    ) -> AgentRecord:
        """Create an agent; a name already used in the workspace is Conflict."""
        need(principal, Permission.AGENTS_WRITE)
        _check(adapter, status)
        breakers = _breakers(breakers)
        now = self._clock()
        agent_id = uuid.uuid4()
        stored = self._configs.stored(adapter, config, agent_id)
        async with self._store.write() as conn:
            await self._check_manager(conn, principal, None, reports_to)
            await agent_store.create_agent(
                conn,
                workspace_id=principal.workspace_id,
                name=name,
                title=title,
                adapter=adapter,
                config=stored,
                now=now,
                status=status,
                max_concurrent_runs=max_concurrent_runs,
                description=description,
                reports_to=reports_to,
                agent_id=agent_id,
                requires_approval=requires_approval,
                approval_ttl_s=approval_ttl_s,
                approval_default=approval_default,
                breakers=breakers,
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
                    "config": public_config(adapter, stored, values=True),
                    "status": status,
                    "max_concurrent_runs": max_concurrent_runs,
                    "description": description,
                    "reports_to": None if reports_to is None else str(reports_to),
                    "requires_approval": requires_approval,
                    "approval_ttl_s": approval_ttl_s,
                    "approval_default": approval_default,
                    "breakers": breakers,
                },
            )
            return await self._agent(conn, principal, agent_id)

    async def update(
        self, principal: Principal, agent_id: UUID, changes: dict[str, Any]
    ) -> AgentRecord:
        """Change any of name, title, config, max_concurrent_runs, status (active or paused)."""
        need(principal, Permission.AGENTS_WRITE)
        if not changes.keys() <= agent_store.UPDATABLE:
            raise InvalidInput(f"only {sorted(agent_store.UPDATABLE)} may be changed")
        _check(status=changes.get("status"))
        if "breakers" in changes:
            changes = {**changes, "breakers": _breakers(changes["breakers"])}
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._agent(conn, principal, agent_id)
            if "config" in changes:
                changes = {
                    **changes,
                    "config": self._configs.stored(
                        before.adapter, changes["config"], agent_id, before.config
                    ),
                }
            changed = {k: v for k, v in changes.items() if getattr(before, k) != v}
            if "status" in changed and before.status == AgentStatus.TERMINATED:
                raise AgentTerminated("a terminated agent cannot be reactivated or paused")
            if not changed:
                return before
            if "reports_to" in changed:
                await self._check_manager(conn, principal, agent_id, changed["reports_to"])
            columns = dict(changed)
            if changed.get("status") == AgentStatus.ACTIVE:
                columns.update(breaker_store.resumed_values(now))
            await agent_store.update_agent(conn, principal.workspace_id, agent_id, columns)
            await audit.record_by(
                conn,
                principal,
                "agent.update",
                "agent",
                agent_id,
                now,
                _changes(before, changed),
            )
            return await self._agent(conn, principal, agent_id)

    async def set_status(self, principal: Principal, agent_id: UUID, status: str) -> AgentRecord:
        """Pause (no new claims; running runs finish), resume, or terminate an agent.

        Setting the status it has is a no-op; a terminated agent stays terminated. Terminating
        revokes the agent's API keys in the same transaction; it does not cancel the agent's
        tasks by itself: `TaskService.cancel_open_of_agent` does.
        """
        need(principal, Permission.AGENTS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            before = await self._agent(conn, principal, agent_id)
            if before.status == status:
                return before
            if before.status == AgentStatus.TERMINATED:
                raise AgentTerminated(f"agent {before.name!r} is terminated")
            columns: dict[str, Any] = {"status": status}
            if status == AgentStatus.ACTIVE:  # a fresh breaker window, no reason left
                columns.update(breaker_store.resumed_values(now))
            await agent_store.update_agent(conn, principal.workspace_id, agent_id, columns)
            action = {
                AgentStatus.ACTIVE.value: "agent.resume",
                AgentStatus.PAUSED.value: "agent.pause",
            }.get(status, "agent.terminate")
            await audit.record_by(
                conn,
                principal,
                action,
                "agent",
                agent_id,
                now,
                _status_change(before, status),
            )
            if status == AgentStatus.TERMINATED:
                await self._revoke_keys(conn, principal, agent_id, now)
            return await self._agent(conn, principal, agent_id)

    @staticmethod
    async def _revoke_keys(
        conn: Connection, principal: Principal, agent_id: UUID, now: datetime
    ) -> None:
        """Revoke a terminated agent's API keys, each revocation audited (issue 19, finding 5)."""
        for key in await key_store.revoke_agent_keys(conn, principal.workspace_id, agent_id, now):
            await audit.record_by(
                conn,
                principal,
                "api_key.revoke",
                "api_key",
                key.id,
                now,
                {
                    "name": key.name,
                    "prefix": key.prefix,
                    "user_id": None,
                    "agent_id": str(agent_id),
                    "reason": "agent terminated",
                },
            )

    async def _check_manager(
        self, conn: Connection, principal: Principal, agent_id: UUID | None, manager: UUID | None
    ) -> None:
        """`manager` may be `agent_id`'s manager: in the workspace, not itself, no cycle."""
        if manager is None:
            return
        await agent_store.lock_org_chart(conn, principal.workspace_id)
        if manager == agent_id:
            raise Conflict("an agent cannot report to itself")
        found = await agent_store.get_agent(conn, principal.workspace_id, manager)
        if found is None:
            raise NotFound("reports_to: no such agent in this workspace")
        if found.status == AgentStatus.TERMINATED:
            raise AgentTerminated(f"reports_to: agent {found.name!r} is terminated")
        if agent_id is not None and agent_id in await agent_store.managers(
            conn, principal.workspace_id, manager
        ):
            raise Conflict(
                f"reporting to {found.name!r} would make a cycle: it already reports, "
                "directly or not, to this agent"
            )

    async def delete(self, principal: Principal, agent_id: UUID) -> None:
        """Delete an agent without tasks (its API keys go with it); else Conflict."""
        need(principal, Permission.AGENTS_WRITE)
        now = self._clock()
        async with self._store.write() as conn:
            agent = await self._agent(conn, principal, agent_id)
            reports = await agent_store.reports_of(conn, principal.workspace_id, agent_id)
            if reports:
                raise Conflict(
                    f"agent {agent.name!r} has reports ({', '.join(reports)}); give them "
                    "another manager (or none) first"
                )
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

    async def _agent(self, conn: Connection, principal: Principal, agent_id: UUID) -> AgentRecord:
        agent = await agent_store.get_agent(conn, principal.workspace_id, agent_id)
        if agent is None:
            raise NotFound("no such agent")
        return agent


def _changes(before: AgentRecord, changed: dict[str, Any]) -> dict[str, Any]:
    """An update as audited: each changed field before and after (a resume that clears a
    breaker's reason shows that too)."""
    data: dict[str, Any] = {
        "before": {k: _shown(before.adapter, k, getattr(before, k)) for k in changed},
        "after": {k: _shown(before.adapter, k, v) for k, v in changed.items()},
    }
    if before.paused_reason is not None and changed.get("status") == AgentStatus.ACTIVE:
        data["before"]["paused_reason"] = before.paused_reason
        data["after"]["paused_reason"] = None
    return data


def _status_change(before: AgentRecord, status: str) -> dict[str, Any]:
    """A status change as audited; a resume that clears a breaker's reason shows it."""
    data: dict[str, Any] = {"before": {"status": before.status}, "after": {"status": status}}
    if before.paused_reason is not None and status == AgentStatus.ACTIVE:
        data["before"]["paused_reason"] = before.paused_reason
        data["after"]["paused_reason"] = None
    return data


def _breakers(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """An agent's breaker overrides as stored: known keys only, positive or None; {} is None."""
    if value is None:
        return None
    if not value.keys() <= set(BREAKER_KEYS):
        raise InvalidInput(f"breakers: only {list(BREAKER_KEYS)} may be set")
    for key, limit in value.items():
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0
        ):
            raise InvalidInput(f"breakers.{key} must be a positive number or null (no limit)")
    return dict(value) or None


def _shown(adapter: str, key: str, value: Any) -> Any:
    """A changed value as the audit log holds it: UUIDs as strings, configs without secrets."""
    if key == "config":
        return public_config(adapter, value, values=True)
    return str(value) if isinstance(value, UUID) else value
