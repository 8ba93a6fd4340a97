"""/api/v1/users: the caller's own account and password; instance admins manage every user."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response

from bullpen.api import cursor, docs
from bullpen.api.deps import Users, authenticated, instance_admin, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.users import (
    MePublic,
    PasswordChange,
    UserCreate,
    UserPage,
    UserPublic,
    UserUpdate,
)
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/users", tags=["users"])

Me = Annotated[Principal, authenticated]
Admin = Annotated[Principal, instance_admin]
# `{user_id:uuid}` in the paths: anything else (like `me` with another method) is no route here.
UserId = Annotated[UUID, docs.path_id("user")]
PageSize = Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")]
Cursor = Annotated[
    str | None,
    Query(alias="cursor", max_length=200, description="`next_cursor` of the previous page"),
]

_USER_LINKS = {
    "GetUser": docs.link("getUser", user_id="$response.body#/id"),
    "UpdateUser": docs.link("updateUser", user_id="$response.body#/id"),
}

# What the caller can look at next: its own workspace and membership.
_ME_LINKS = {
    "GetWorkspace": docs.link("getWorkspace", workspace_id="$response.body#/workspace_id"),
    "UpdateWorkspace": docs.link("updateWorkspace", workspace_id="$response.body#/workspace_id"),
    "GetMember": docs.link("getMember", user_id="$response.body#/id"),
}


@router.get(
    "/me",
    operation_id="getMe",
    response_model=MePublic,
    responses={
        200: {"description": "The calling user", "links": _ME_LINKS},
        **docs.problems(401, 404, 429, 503),
    },
    summary="Get the calling user",
)
async def get_me(principal: Me, users: Users) -> MePublic:
    """The signed-in user (or the user owning the API key); an agent's key has none (404)."""
    row, role = await users.me(principal)
    return MePublic.from_row(row, role, principal.workspace_id)


@router.put(
    "/me/password",
    operation_id="changeMyPassword",
    status_code=204,
    response_class=Response,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 413, 415, 422, 429, 503),
    summary="Change the calling user's password",
)
async def change_password(body: PasswordChange, principal: Me, users: Users) -> Response:
    """Needs the current password (any mismatch is 403); every session ends, so sign in again."""
    await users.change_password(principal, body.current_password, body.new_password)
    return Response(status_code=204)


@router.get(
    "",
    operation_id="listUsers",
    response_model=UserPage,
    responses=docs.problems(401, 403, 422, 429, 503),
    summary="List users (instance admins)",
)
async def list_users(
    principal: Admin, users: Users, limit: PageSize = 50, cursor_: Cursor = None
) -> UserPage:
    """Every user of the instance, oldest first, keyset-paginated."""
    page = await users.list(principal, limit=limit, after=cursor.after(cursor_))
    return UserPage(
        items=[UserPublic.from_row(row) for row in page.rows], next_cursor=cursor.next_of(page)
    )


@router.post(
    "",
    operation_id="createUser",
    status_code=201,
    response_model=UserPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(UserPublic, "The user (a member of no workspace yet)", _USER_LINKS),
        **docs.problems(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    summary="Create a user (instance admins)",
)
async def create_user(
    body: UserCreate, principal: Admin, users: Users, idem: Idempotent
) -> Response:
    """A new account; a taken email is 409. The password is stored only as an argon2id hash."""
    # Hashed before the write transaction opens: no writer waits on argon2.
    password_hash = await users.new_password_hash(body.password)
    async with idem.begin(principal) as tx:
        row = await users.create(
            principal,
            email=body.email,
            name=body.name,
            password_hash=password_hash,
            is_instance_admin=body.is_instance_admin,
        )
        return tx.respond(201, UserPublic.from_row(row), location=f"/api/v1/users/{row.id}")


@router.get(
    "/{user_id:uuid}",
    operation_id="getUser",
    response_model=UserPublic,
    responses=docs.problems(401, 403, 404, 429, 503),
    summary="Get a user (instance admins)",
)
async def get_user(user_id: UserId, principal: Admin, users: Users) -> UserPublic:
    """One user of the instance."""
    return UserPublic.from_row(await users.get(principal, user_id))


@router.patch(
    "/{user_id:uuid}",
    operation_id="updateUser",
    response_model=UserPublic,
    dependencies=[Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Change, disable or promote a user (instance admins)",
)
async def update_user(
    user_id: UserId, body: UserUpdate, principal: Admin, users: Users
) -> UserPublic:
    """Only the fields sent change. Disabling ends the user's sessions and stops its keys; an
    admin cannot disable or demote itself (409)."""
    row = await users.update(principal, user_id, body.model_dump(exclude_unset=True))
    return UserPublic.from_row(row)
