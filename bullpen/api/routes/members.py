"""/api/v1/members: who belongs to the caller's workspace, with which role.

Users join by accepting an invitation (`POST /api/v1/invitations`; `POST /api/v1/members`
invites too, since issue 19). Only an owner grants, changes or removes the owner role, and a
workspace always keeps at least one owner.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response

from bullpen.api import cursor, docs
from bullpen.api.deps import Invitations, require, require_json
from bullpen.api.deps import Workspaces as Members
from bullpen.api.idempotency import Idempotent
from bullpen.api.routes.invitations import LINKS
from bullpen.api.routes.invitations import create as invite
from bullpen.api.schemas.invitations import InvitationCreate, InvitationPublic
from bullpen.api.schemas.members import (
    MemberPage,
    MemberPublic,
    MemberUpdate,
)
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/members", tags=["members"])


Reader = Annotated[Principal, require(Permission.MEMBERS_READ)]
Writer = Annotated[Principal, require(Permission.MEMBERS_WRITE)]
UserId = Annotated[UUID, docs.path_id("member's user")]
PageSize = Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")]
Cursor = Annotated[
    str | None,
    Query(alias="cursor", max_length=200, description="`next_cursor` of the previous page"),
]


@router.get(
    "",
    operation_id="listMembers",
    response_model=MemberPage,
    responses=docs.problems(401, 403, 422, 429, 503),
    summary="List the workspace's members",
)
async def list_members(
    principal: Reader, members: Members, limit: PageSize = 50, cursor_: Cursor = None
) -> MemberPage:
    """Members with their roles, in the order they joined, keyset-paginated."""
    page = await members.members(principal, limit=limit, after=cursor.after(cursor_))
    return MemberPage(
        items=[MemberPublic.from_row(row) for row in page.rows], next_cursor=cursor.next_of(page)
    )


@router.post(
    "",
    operation_id="addMember",
    status_code=201,
    response_model=InvitationPublic,
    dependencies=[Depends(require_json)],
    deprecated=True,
    responses={
        **docs.created(InvitationPublic, "The invitation (for any email alike)", LINKS),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Invite an email to the workspace (use `POST /api/v1/invitations`)",
)
async def add_member(
    body: InvitationCreate, principal: Writer, invitations: Invitations, idem: Idempotent
) -> Response:
    """Since issue 19 this no longer attaches a user: it invites the email, exactly as
    `POST /api/v1/invitations` does, and the membership exists once the user accepts."""
    return await invite(body, principal, invitations, idem)


@router.get(
    "/{user_id}",
    operation_id="getMember",
    response_model=MemberPublic,
    responses=docs.problems(401, 403, 404, 422, 429, 503),
    summary="Get a member",
)
async def get_member(user_id: UserId, principal: Reader, members: Members) -> MemberPublic:
    """One member of the workspace, by user id."""
    return MemberPublic.from_row(await members.member(principal, user_id))


@router.patch(
    "/{user_id}",
    operation_id="updateMember",
    response_model=MemberPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Change a member's role or approver mark",
)
async def update_member(
    user_id: UserId, body: MemberUpdate, principal: Writer, members: Members
) -> MemberPublic:
    """Only owners grant `owner` or change an owner's role; demoting the last owner is 409.
    `approver` marks a member who may decide approvals (owners and admins always may)."""
    sent = body.model_fields_set
    row = None
    if "role" in sent:
        row = await members.change_role(principal, user_id, body.role)
    if "approver" in sent:
        row = await members.set_approver(principal, user_id, bool(body.approver))
    if row is None:  # nothing sent: nothing changes
        row = await members.member(principal, user_id)
    return MemberPublic.from_row(row)


@router.delete(
    "/{user_id}",
    operation_id="removeMember",
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 409, 422, 429, 503),
    summary="Remove a member from the workspace",
)
async def remove_member(user_id: UserId, principal: Writer, members: Members) -> Response:
    """Ends the member's sessions and revokes its API keys in this workspace. Admins cannot
    remove owners (403); removing the last owner is 409."""
    await members.remove_member(principal, user_id)
    return Response(status_code=204)
