"""/api/v1/approvals: the workspace's approvals (human in the loop); approve or deny one."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query

from bullpen.api import cursor, docs
from bullpen.api.deps import ServicesDep, require, require_json
from bullpen.api.schemas.approvals import (
    ApprovalApproval,
    ApprovalDecision,
    ApprovalPage,
    ApprovalPublic,
)
from bullpen.domain.access import Permission
from bullpen.domain.approvals import ApprovalStatus, Outcome
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/approvals", tags=["approvals"])

Reader = Annotated[Principal, require(Permission.TASKS_READ)]
# Owners and admins hold `approvals:decide`; a member marked approver decides too (checked by
# the service), so the route asks only that the caller may write tasks.
Decider = Annotated[Principal, require(Permission.TASKS_WRITE)]
ApprovalId = Annotated[UUID, docs.path_id("approval")]
_LINKS = {
    "ApproveApproval": docs.link("approveApproval", approval_id="$response.body#/id"),
    "DenyApproval": docs.link("denyApproval", approval_id="$response.body#/id"),
}


@router.get(
    "",
    operation_id="listApprovals",
    response_model=ApprovalPage,
    responses=docs.problems(401, 403, 422, 429, 503),
    summary="List the workspace's approvals",
)
async def list_approvals(
    principal: Reader,
    svc: ServicesDep,
    status: Annotated[
        ApprovalStatus | None, Query(description="Only approvals in this status")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")] = 50,
    cursor_: Annotated[
        str | None,
        Query(alias="cursor", max_length=200, description="`next_cursor` of the previous page"),
    ] = None,
) -> ApprovalPage:
    """Newest first, keyset-paginated; `status=pending` lists what waits for a decision."""
    page = await svc.approvals.list(
        principal, limit=limit, after=cursor.after(cursor_), status=status
    )
    ttl = svc.approvals.default_ttl_s
    return ApprovalPage(
        items=[ApprovalPublic.from_row(row, ttl) for row in page.rows],
        next_cursor=cursor.next_of(page),
    )


@router.get(
    "/{approval_id}",
    operation_id="getApproval",
    response_model=ApprovalPublic,
    responses=docs.problems(*docs.READ),
    summary="Get an approval",
)
async def get_approval(
    approval_id: ApprovalId, principal: Reader, svc: ServicesDep
) -> ApprovalPublic:
    """One approval of the workspace (a tool call's shows the held calls)."""
    found = await svc.approvals.get(principal, approval_id)
    return ApprovalPublic.from_row(found, svc.approvals.default_ttl_s)


@router.post(
    "/{approval_id}/approve",
    operation_id="approveApproval",
    response_model=ApprovalPublic,
    dependencies=[Depends(require_json)],
    responses={200: {"links": _LINKS}, **docs.problems(*docs.WRITE)},
    summary="Approve an approval",
)
async def approve(
    approval_id: ApprovalId, body: ApprovalApproval, principal: Decider, svc: ServicesDep
) -> ApprovalPublic:
    """A held task is queued; a held tool step runs in the task's next run; a budget override
    (with `amount_usd`) lets the task spend that much past its budgets and queues it again.
    Owners, admins and members marked approver decide (else 403); deciding twice is 409
    `approval-decided`."""
    decided = await svc.approvals.decide(
        principal, approval_id, Outcome.APPROVE, body.reason, body.amount_usd
    )
    return ApprovalPublic.from_row(decided, svc.approvals.default_ttl_s)


@router.post(
    "/{approval_id}/deny",
    operation_id="denyApproval",
    response_model=ApprovalPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(*docs.WRITE),
    summary="Deny an approval",
)
async def deny(
    approval_id: ApprovalId, body: ApprovalDecision, principal: Decider, svc: ServicesDep
) -> ApprovalPublic:
    """A held task is cancelled with the reason; a held tool step's gated calls are not made
    and the model is told they were denied, with the reason. Who may decide and deciding
    twice: as for approve."""
    decided = await svc.approvals.decide(principal, approval_id, Outcome.DENY, body.reason)
    return ApprovalPublic.from_row(decided, svc.approvals.default_ttl_s)
