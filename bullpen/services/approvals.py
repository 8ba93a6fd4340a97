"""Approval use cases: list and read approvals, decide one (once), and expire the undecided.

Who decides: an owner or admin (the `approvals:decide` permission), or a member marked approver
(`memberships.approver`) whose caller may write tasks. Agents never decide. A decision commits
with its effect, its audit event and its `approval.decided` notice in one transaction:

- `task`: approved, the task is queued with a run; denied, it is cancelled with the reason.
- `tool_call`: either way the task is queued again; its next run carries the held step out
  (a denied call's result tells the model so) and the loop goes on.
- `budget_override` (opened when a budget stopped a run): approved with an amount, the task
  gets that much room past its budgets, once, and is queued again if it had failed; denied,
  it stays failed.
- other kinds: the effect registered for the kind (`register`).

A decision on a task that has left `awaiting_approval` meanwhile (cancelled) is recorded and
changes nothing else. An approval still pending past its time is decided by its default outcome
(`expired`) by the housekeeping sweep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from uuid import UUID

from bullpen.domain.access import Permission, need
from bullpen.domain.approvals import (
    REASON_MAX,
    ApprovalKind,
    ApprovalRecord,
    ApprovalStatus,
    Outcome,
)
from bullpen.domain.principal import Principal, Role
from bullpen.errors import ApprovalDecided, Forbidden, InvalidInput, NotFound
from bullpen.store import approvals as approval_store
from bullpen.store import audit, workflow
from bullpen.store import budgets as budget_store
from bullpen.store import tasks as task_store
from bullpen.store import workspaces as ws_store
from bullpen.store.base import Connection, Store
from bullpen.store.paging import Page

DEFAULT_TTL_S = 86_400.0
EXPIRE_BATCH = 100
# What a decision does for a kind other than task and tool_call: (conn, approval, approved,
# now) -> whether a run was queued.
Effect = Callable[[Connection, ApprovalRecord, bool, datetime], Awaitable[bool]]


class ApprovalService:
    """Reads and decides the caller's workspace's approvals."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        on_enqueued: Callable[[], None],
        default_ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self._store = store
        self._clock = clock
        self._on_enqueued = on_enqueued
        self.default_ttl_s = default_ttl_s
        self._effects: dict[str, Effect] = {}

    def register(self, kind: ApprovalKind, effect: Effect) -> None:
        """Say what deciding an approval of `kind` does (budget overrides)."""
        self._effects[kind.value] = effect

    async def list(
        self,
        principal: Principal,
        *,
        limit: int,
        after: tuple[datetime, UUID] | None,
        status: ApprovalStatus | None = None,
    ) -> Page[ApprovalRecord]:
        """A page of the workspace's approvals, newest first."""
        need(principal, Permission.TASKS_READ)
        async with self._store.read() as conn:
            return await approval_store.list_approvals(
                conn,
                principal.workspace_id,
                limit=limit,
                after=after,
                status=None if status is None else status.value,
            )

    async def get(self, principal: Principal, approval_id: UUID) -> ApprovalRecord:
        """One approval of the workspace."""
        need(principal, Permission.TASKS_READ)
        async with self._store.read() as conn:
            found = await approval_store.get(conn, principal.workspace_id, approval_id)
        if found is None:
            raise NotFound("no such approval in this workspace")
        return found

    async def decide(
        self,
        principal: Principal,
        approval_id: UUID,
        outcome: Outcome,
        reason: str | None,
        amount_usd: float | None = None,
    ) -> ApprovalRecord:
        """Approve or deny a pending approval; a decided one is 409 (`approval-decided`).
        Approving a `budget_override` needs `amount_usd`, which nothing else takes."""
        if reason is not None and len(reason) > REASON_MAX:
            raise InvalidInput(f"the reason is longer than {REASON_MAX} characters")
        if amount_usd is not None and outcome is not Outcome.APPROVE:
            raise InvalidInput("only approving a budget override takes amount_usd")
        now = self._clock()
        async with self._store.write() as conn:
            await self._check_decider(conn, principal)  # whatever the object: 403 before 404
            found = await approval_store.get(conn, principal.workspace_id, approval_id)
            if found is None:
                raise NotFound("no such approval in this workspace")
            approve = outcome is Outcome.APPROVE
            _check_amount(found, approve, amount_usd)
            status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
            decided = await approval_store.decide(
                conn,
                approval_id,
                status=status,
                reason=reason,
                now=now,
                user_id=principal.user_id,
                key_id=principal.api_key_id,
            )
            if decided is None:
                raise ApprovalDecided(f"the approval was decided already ({found.status})")
            queued = await self._apply(conn, decided, now, amount_usd)
            data = _audited(decided, queued)
            if amount_usd is not None:
                data["amount_usd"] = amount_usd
            await audit.record_by(
                conn, principal, f"approval.{outcome.value}", "approval", approval_id, now, data
            )
            self._store.after_commit(self._on_enqueued)
        return decided

    async def expire(self, limit: int = EXPIRE_BATCH) -> int:
        """Decide up to `limit` approvals past their time by their default outcome."""
        now = self._clock()
        count = 0
        async with self._store.write() as conn:
            for approval in await approval_store.expired(conn, now, self.default_ttl_s, limit):
                reason = f"expired undecided; its default outcome is {approval.default_outcome}"
                decided = await approval_store.decide(
                    conn, approval.id, status=ApprovalStatus.EXPIRED, reason=reason, now=now
                )
                if decided is None:  # decided meanwhile
                    continue
                queued = await self._apply(conn, decided, now)
                await audit.record(
                    conn,
                    workspace_id=decided.workspace_id,
                    actor_type="system",
                    actor_id=None,
                    action="approval.expire",
                    target_type="approval",
                    target_id=decided.id,
                    now=now,
                    data=_audited(decided, queued),
                )
                count += 1
            if count:
                self._store.after_commit(self._on_enqueued)
        return count

    async def _check_decider(self, conn: Connection, principal: Principal) -> None:
        if principal.agent_id is not None:
            raise Forbidden("an agent cannot decide approvals")
        if principal.can(Permission.APPROVALS_DECIDE):
            return
        if (
            principal.role is Role.MEMBER
            and principal.user_id is not None
            and principal.can(Permission.TASKS_WRITE)
            and await ws_store.is_approver(conn, principal.workspace_id, principal.user_id)
        ):
            return
        raise Forbidden("only an owner, an admin or a member marked approver may decide")

    async def _apply(
        self,
        conn: Connection,
        approval: ApprovalRecord,
        now: datetime,
        amount_usd: float | None = None,
    ) -> bool:
        """The decision's effect; whether a run was queued."""
        approved = bool(approval.approved)
        if approval.kind == ApprovalKind.BUDGET_OVERRIDE:
            if not approved or amount_usd is None:  # denied, or expired by its default
                return False
            await budget_store.add_override(conn, approval.task_id, amount_usd)
            return await task_store.requeue_failed(conn, approval.task_id, now)
        if approval.kind in (ApprovalKind.TASK, ApprovalKind.TOOL_CALL):
            # Guarded by the task still awaiting approval: a task cancelled meanwhile stays so;
            # a tool call decided before the run that held it ended is released by that end.
            if approval.kind == ApprovalKind.TASK and not approved:
                why = f": {approval.reason}" if approval.reason else ""
                error = f"the approval was {approval.status}{why}"[:REASON_MAX]
                if await approval_store.refuse(conn, approval.task_id, error, now):
                    # It ended: a parent or a task it blocks may go on (a run queued for it).
                    return bool(await workflow.ended_task(conn, approval.task_id, now))
                return False
            return await approval_store.release(conn, approval.task_id, now) is not None
        effect = self._effects.get(approval.kind)
        return False if effect is None else await effect(conn, approval, approved, now)


def _check_amount(approval: ApprovalRecord, approve: bool, amount_usd: float | None) -> None:
    override = approval.kind == ApprovalKind.BUDGET_OVERRIDE
    if amount_usd is not None and not override:
        raise _amount_error(
            f"amount_usd is for budget overrides; this approval is of a {approval.kind}"
        )
    if override and approve and amount_usd is None:
        raise _amount_error("approving a budget override needs amount_usd: how much more to allow")


def _amount_error(message: str) -> InvalidInput:
    # `amount_kind`: whether an amount belongs depends on the approval's kind.
    error = {"location": "body", "field": "amount_usd", "message": message, "code": "amount_kind"}
    return InvalidInput(message, errors=[error])


def _audited(approval: ApprovalRecord, queued: bool) -> dict[str, object]:
    return {
        "kind": approval.kind,
        "task_id": str(approval.task_id),
        "status": approval.status,
        "approved": approval.approved,
        "reason": approval.reason,
        "queued": queued,
    }
