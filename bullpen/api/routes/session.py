"""/api/v1/session: the workspace a signed-in session acts in (issue 19, finding 10)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from bullpen.api import docs
from bullpen.api.deps import ServicesDep, authenticated, require_json, session_cookie_name
from bullpen.api.schemas.workspaces import (
    WorkspaceMembership,
    WorkspaceSwitch,
)
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/session", tags=["workspaces"])


@router.post(
    "/workspace",
    operation_id="switchWorkspace",
    response_model=WorkspaceMembership,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Switch the session to another of the user's workspaces",
)
async def switch_workspace(
    body: WorkspaceSwitch,
    request: Request,
    principal: Annotated[Principal, authenticated],
    svc: ServicesDep,
) -> WorkspaceMembership:
    """Later requests of this session act in that workspace, with the user's role there.

    A workspace the user does not belong to is 404. An API key acts only in the workspace it
    was created for: naming that one is a no-op, another of its user's workspaces is 409
    (create a key there with `POST /api/v1/api-keys` and `workspace_id`).
    """
    entry = await svc.workspaces.membership(principal, body.workspace_id)
    session_id = request.cookies.get(session_cookie_name(request))
    if principal.via == "session" and session_id:
        await svc.auth.switch_workspace(session_id, principal, entry.id)
    return WorkspaceMembership.from_membership(entry)
