"""Invitations (issue 19, finding 10): admins invite an email; the invited user accepts.

`/api/v1/invitations` is the workspace's side (invite, list, revoke: `members:write`);
`/api/v1/users/me/invitations` is the invited user's (list, accept, decline). Inviting answers
the same for every email, so it does not tell which emails have an account; the membership
exists only once the invited user accepts, before the invitation expires.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Response

from bullpen.api import docs
from bullpen.api.deps import Invitations, authenticated, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.invitations import (
    InvitationCreate,
    InvitationList,
    InvitationPublic,
)
from bullpen.api.schemas.workspaces import WorkspaceMembership
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.services.workspaces import Membership

router = APIRouter(prefix="/api/v1", tags=["members"])


InvitationId = Annotated[UUID, docs.path_id("invitation")]
Writer = Annotated[Principal, require(Permission.MEMBERS_WRITE)]
Me = Annotated[Principal, authenticated]

LINKS = {"RevokeInvitation": docs.link("revokeInvitation", invitation_id="$response.body#/id")}


async def create(
    body: InvitationCreate, principal: Principal, invitations: Invitations, idem: Idempotent
) -> Response:
    """The shared body of `createInvitation` and the deprecated `addMember`."""
    async with idem.begin(principal) as tx:
        row = await invitations.invite(principal, email=body.email, role=body.role)
        return tx.respond(
            201, InvitationPublic.from_row(row), location=f"/api/v1/invitations/{row.id}"
        )


@router.post(
    "/invitations",
    operation_id="createInvitation",
    status_code=201,
    response_model=InvitationPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(InvitationPublic, "The invitation (for any email alike)", LINKS),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Invite an email to the workspace",
)
async def create_invitation(
    body: InvitationCreate, principal: Writer, invitations: Invitations, idem: Idempotent
) -> Response:
    """The same answer whether or not the email has an account; inviting again renews the
    invitation. An email of a member already is 409; so is a workspace at its limit of
    pending invitations (`BULLPEN_INVITATIONS_MAX`)."""
    return await create(body, principal, invitations, idem)


@router.get(
    "/invitations",
    operation_id="listInvitations",
    response_model=InvitationList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List the workspace's pending invitations",
)
async def list_invitations(principal: Writer, invitations: Invitations) -> InvitationList:
    """Live (unexpired, unanswered) invitations, newest first."""
    rows = await invitations.pending(principal)
    return InvitationList(items=[InvitationPublic.from_row(row) for row in rows])


@router.delete(
    "/invitations/{invitation_id}",
    operation_id="revokeInvitation",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Revoke a pending invitation",
)
async def revoke_invitation(
    invitation_id: InvitationId, principal: Writer, invitations: Invitations
) -> Response:
    """It can no longer be accepted; an answered or expired invitation is 404."""
    await invitations.revoke(principal, invitation_id)
    return Response(status_code=204)


@router.get(
    "/users/me/invitations",
    operation_id="listMyInvitations",
    response_model=InvitationList,
    responses=docs.problems(401, 404, 429, 503),
    summary="List the invitations addressed to the calling user",
)
async def list_my_invitations(principal: Me, invitations: Invitations) -> InvitationList:
    """Live invitations to the caller's email, newest first; an agent's key has none (404)."""
    rows = await invitations.mine(principal)
    return InvitationList(items=[InvitationPublic.from_row(row) for row in rows])


@router.post(
    "/users/me/invitations/{invitation_id}/accept",
    operation_id="acceptInvitation",
    response_model=WorkspaceMembership,
    responses=docs.problems(401, 404, 422, 429, 503),
    summary="Accept an invitation: join its workspace",
)
async def accept_invitation(
    invitation_id: InvitationId, principal: Me, invitations: Invitations
) -> WorkspaceMembership:
    """The caller becomes a member with the invited role (switch to it with
    `POST /api/v1/session/workspace`). Another user's, answered or expired invitation is 404."""
    row, role = await invitations.accept(principal, invitation_id)
    entry = Membership(
        id=row.id,
        name=row.name,
        slug=row.slug,
        task_key=row.task_key,
        role=role,
        current=row.id == principal.workspace_id,
    )
    return WorkspaceMembership.from_membership(entry)


@router.post(
    "/users/me/invitations/{invitation_id}/decline",
    operation_id="declineInvitation",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 404, 422, 429, 503),
    summary="Decline an invitation",
)
async def decline_invitation(
    invitation_id: InvitationId, principal: Me, invitations: Invitations
) -> Response:
    """The invitation is deleted; nothing else changes."""
    await invitations.decline(principal, invitation_id)
    return Response(status_code=204)
