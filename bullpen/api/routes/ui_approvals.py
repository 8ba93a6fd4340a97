"""The dashboard's approvals inbox: pending approvals first, live (the workspace stream's
approval notices re-read the list), each approved or denied with a reason through the
approval service, as the API's decide does."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import Found, form_session, message, page, page_session, refused
from bullpen.app import Services
from bullpen.domain.approvals import REASON_MAX, ApprovalStatus, Outcome
from bullpen.errors import BullpenError, InvalidInput
from bullpen.store import changes as change_log
from bullpen.streams.changes import cursor_id

router = APIRouter(include_in_schema=False)

SECTION = "approvals"
PENDING_SHOWN = 100
DECIDED_SHOWN = 20


async def _inbox(
    request: Request, svc: Services, found: Found, *, status: int = 200, error: str | None = None
) -> HTMLResponse:
    principal = found[1].principal
    async with svc.store.read() as conn:  # before the list: live updates start here
        live_from = await change_log.head(conn, principal.workspace_id)
    try:
        pending = await svc.approvals.list(
            principal, limit=PENDING_SHOWN, after=None, status=ApprovalStatus.PENDING
        )
        recent = await svc.approvals.list(principal, limit=DECIDED_SHOWN, after=None)
        agents = await svc.agents.list(principal)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    return await page(
        request,
        svc,
        found,
        "approvals.html",
        section=SECTION,
        status=status,
        error=error,
        pending=pending.rows,
        decided=[a for a in recent.rows if a.status != ApprovalStatus.PENDING],
        names={a.id: a.name for a in agents},
        live_from=cursor_id(live_from).decode(),
        reason_max=REASON_MAX,
    )


@router.get("/approvals", response_class=HTMLResponse, response_model=None)
async def approvals_page(request: Request, svc: ServicesDep) -> Response:
    """Pending approvals, oldest decisions below; updated live."""
    found = await page_session(request, svc)
    return await _inbox(request, svc, found)


@router.post("/ui/approvals/{approval_id}", response_model=None)
async def decide(
    approval_id: UUID,
    request: Request,
    svc: ServicesDep,
    outcome: Annotated[str, Form(max_length=10)] = "",
    reason: Annotated[str, Form(max_length=4 * REASON_MAX)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Approve or deny, with an optional reason."""
    found = await form_session(request, svc, csrf)
    try:
        if outcome not in {o.value for o in Outcome}:
            raise InvalidInput("outcome: approve or deny")
        await svc.approvals.decide(
            found[1].principal, approval_id, Outcome(outcome), reason.strip() or None
        )
    except BullpenError as err:
        await refused(request, err)
        return await _inbox(request, svc, found, status=err.status, error=err.detail)
    return RedirectResponse("/approvals", status_code=303)
