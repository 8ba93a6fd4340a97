"""/api/v1/workspaces: the caller's workspaces; create (instance admins), rename, delete.

A caller acts in one workspace at a time; reading, changing or deleting any other is 404.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Response

from bullpen.api import docs
from bullpen.api.deps import (
    Workspaces,
    authenticated,
    instance_admin,
    require,
    require_json,
)
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.workspaces import (
    WorkspaceCreate,
    WorkspaceList,
    WorkspaceMembership,
    WorkspacePublic,
    WorkspaceUpdate,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/workspaces", tags=["workspaces"])

WorkspaceId = Annotated[UUID, docs.path_id("workspace")]

_WORKSPACE_LINKS = {
    # The creator's key still acts in its own workspace: the new one shows in its list.
    "ListWorkspaces": docs.link("listWorkspaces"),
}


@router.get(
    "",
    operation_id="listWorkspaces",
    response_model=WorkspaceList,
    responses=docs.problems(401, 429, 503),
    summary="List the caller's workspaces",
)
async def list_workspaces(
    principal: Annotated[Principal, authenticated], workspaces: Workspaces
) -> WorkspaceList:
    """A user's memberships with its role in each; an agent's key sees only its own workspace."""
    entries = await workspaces.mine(principal)
    return WorkspaceList(items=[WorkspaceMembership.from_membership(e) for e in entries])


@router.post(
    "",
    operation_id="createWorkspace",
    status_code=201,
    response_model=WorkspacePublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(
            WorkspacePublic, "The workspace; its creator is its owner", _WORKSPACE_LINKS
        ),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Create a workspace (instance admins)",
)
async def create_workspace(
    body: WorkspaceCreate,
    principal: Annotated[Principal, instance_admin],
    workspaces: Workspaces,
    idem: Idempotent,
) -> Response:
    """A new, empty workspace owned by the caller; a slug already in use is 409."""
    async with idem.begin(principal) as tx:
        row = await workspaces.create(
            principal, name=body.name, slug=body.slug, task_key=body.task_key
        )
        return tx.respond(
            201, WorkspacePublic.from_row(row), location=f"/api/v1/workspaces/{row.id}"
        )


@router.get(
    "/{workspace_id}",
    operation_id="getWorkspace",
    response_model=WorkspacePublic,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Get the current workspace",
)
async def get_workspace(
    workspace_id: WorkspaceId,
    principal: Annotated[Principal, require(Permission.WORKSPACE_READ)],
    workspaces: Workspaces,
) -> WorkspacePublic:
    """The workspace the caller acts in; any other id is 404."""
    return WorkspacePublic.from_row(await workspaces.get(principal, workspace_id))


@router.patch(
    "/{workspace_id}",
    operation_id="updateWorkspace",
    response_model=WorkspacePublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 413, 415, 422, 429, 503),
    summary="Rename the current workspace",
)
async def update_workspace(
    workspace_id: WorkspaceId,
    body: WorkspaceUpdate,
    principal: Annotated[Principal, require(Permission.WORKSPACE_WRITE)],
    workspaces: Workspaces,
) -> WorkspacePublic:
    """Only the fields sent change; `null` is not a value."""
    row = await workspaces.update(principal, workspace_id, body.model_dump(exclude_unset=True))
    return WorkspacePublic.from_row(row)


@router.delete(
    "/{workspace_id}",
    operation_id="deleteWorkspace",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 409, 422, 429, 503),
    summary="Delete the current workspace and everything in it",
)
async def delete_workspace(
    workspace_id: WorkspaceId,
    principal: Annotated[Principal, require(Permission.WORKSPACE_DELETE)],
    workspaces: Workspaces,
) -> Response:
    """Agents, tasks, runs, keys, members: all go. While a run is running it is 409 (cancel
    its task first). The audit log keeps the record of the deletion."""
    await workspaces.delete(principal, workspace_id)
    return Response(status_code=204)
