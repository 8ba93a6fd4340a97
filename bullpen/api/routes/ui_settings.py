"""The dashboard's settings: members and their roles, invitations (the workspace's and the
user's own), API keys (a new key shown exactly once), and the account page (ui.py).

Every form calls the service the API's route calls, validated by the API's own schema, so
its permission checks and messages are the API's; a page shows only the controls the role
may use, and the server refuses the rest regardless.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any
from uuid import UUID

import orjson
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from bullpen.api import cursor
from bullpen.api.deps import ServicesDep
from bullpen.api.idempotency import IdempotentWrite, check_key
from bullpen.api.problems import Replayed
from bullpen.api.routes.ui import Found, form_session, message, page, page_session, refused
from bullpen.api.schemas.invitations import InvitationCreate, InvitationPublic
from bullpen.api.schemas.keys import ApiKeyCreate, ApiKeyCreated, ApiKeyPublic
from bullpen.api.schemas.members import MemberUpdate
from bullpen.app import Services
from bullpen.domain import tokens
from bullpen.domain.access import Permission
from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import NO_WORKSPACE, Role
from bullpen.errors import BullpenError, InvalidInput
from bullpen.services.api_keys import EXPIRY_MAX, LIMIT_MAX

router = APIRouter(include_in_schema=False)

SECTION = "settings"
MEMBERS_PAGE = 50
EXPIRY_DAYS_MAX = EXPIRY_MAX.days
CREATE_KEY = "POST /ui/settings/api-keys"  # what a create form's one-time token is scoped to
# Notices for `?done=<key>` after a form: fixed texts, never reflected input.
NOTICES = {
    "role": "Role changed.",
    "removed": "Member removed: its sessions here ended and its API keys here were revoked.",
    "disabled": "Account disabled: its sessions ended and its API keys stopped working.",
    "enabled": "Account enabled again.",
    "revoked": "Invitation revoked.",
    "accepted": "Invitation accepted: switch to its workspace with the picker at the top.",
    "declined": "Invitation declined.",
    "key_revoked": "API key revoked: it stops working at once.",
}
REPLAYED = (
    "This form was sent already and its key was shown then, once: it is never shown again. "
    "If you did not copy it, revoke that key and create another."
)


def _validation_message(err: ValidationError) -> str:
    """The API's field errors (`loc: msg`), as one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


async def _form(request: Request) -> tuple[dict[str, str], list[str]]:
    """The posted fields (the last value of each) and the checked scopes."""
    data = await request.form()
    fields = {k: v for k, v in data.items() if isinstance(v, str)}
    return fields, [v for v in data.getlist("scopes") if isinstance(v, str)]


async def _settings(
    request: Request,
    svc: Services,
    found: Found,
    name: str,
    *,
    tab: str,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    """A settings page: the layout's settings section with its own tabs."""
    principal = found[1].principal
    return await page(
        request,
        svc,
        found,
        name,
        section=SECTION,
        tab=tab,
        status=status,
        in_workspace=principal.workspace_id != NO_WORKSPACE,
        **context,
    )


def _back(path: str, done: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?done={done}", status_code=303)


@router.get("/settings", response_model=None)
async def settings_home(request: Request, svc: ServicesDep) -> Response:
    """The settings start at the members."""
    await page_session(request, svc)  # signed in, or the sign-in page
    return RedirectResponse("/settings/members", status_code=303)


# ---------------------------------------------------------------------------- members


async def _members(
    request: Request,
    svc: Services,
    found: Found,
    *,
    after: str | None = None,
    status: int = 200,
    error: str | None = None,
    notice: str | None = None,
    confirm: dict[str, Any] | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    if principal.workspace_id == NO_WORKSPACE:
        return await _settings(request, svc, found, "settings_members.html", tab="members")
    try:
        listed = await svc.workspaces.members(
            principal, limit=MEMBERS_PAGE, after=cursor.after(after)
        )
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    roles = [r for r in Role if r is not Role.OWNER or principal.role is Role.OWNER]
    return await _settings(
        request,
        svc,
        found,
        "settings_members.html",
        tab="members",
        status=status,
        error=error,
        notice=notice,
        confirm=confirm,
        members=listed.rows,
        next_cursor=cursor.next_of(listed),
        roles=roles,
        my_role=principal.role,
        me=principal.user_id,
        instance_admin=principal.is_instance_admin,
    )


@router.get("/settings/members", response_class=HTMLResponse, response_model=None)
async def members_page(
    request: Request,
    svc: ServicesDep,
    cursor_: Annotated[str | None, Query(alias="cursor", max_length=200)] = None,
    done: Annotated[str, Query(max_length=20)] = "",
) -> Response:
    """The workspace's members with their roles, oldest first, 50 a page."""
    found = await page_session(request, svc)
    return await _members(request, svc, found, after=cursor_, notice=NOTICES.get(done))


@router.post("/ui/settings/members/{user_id}/role", response_model=None)
async def change_role(
    user_id: UUID,
    request: Request,
    svc: ServicesDep,
    role: Annotated[str, Form(max_length=20)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Give a member another role, as `PATCH /api/v1/members/{id}` does."""
    found = await form_session(request, svc, csrf)
    try:
        body = MemberUpdate.model_validate({"role": role})
        await svc.workspaces.change_role(found[1].principal, user_id, body.role)
    except ValidationError as err:
        return await _members(request, svc, found, status=422, error=_validation_message(err))
    except BullpenError as err:
        await refused(request, err)
        return await _members(request, svc, found, status=err.status, error=err.detail)
    return _back("/settings/members", "role")


@router.post("/ui/settings/members/{user_id}/{op}", response_model=None)
async def member_op(
    user_id: UUID,
    op: str,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Remove a member (`DELETE /api/v1/members/{id}`), or disable or enable its account
    (`PATCH /api/v1/users/{id}`, instance admins): the first post asks, the second acts."""
    found = await form_session(request, svc, csrf)
    if op not in {"remove", "disable", "enable"}:
        bad = InvalidInput(f"unknown action {op!r}")
        return await message(request, svc, found, bad, section=SECTION)
    principal = found[1].principal
    try:
        member = await svc.workspaces.member(principal, user_id)
        if op != "enable" and confirmed != "yes":
            confirm = {"op": op, "member": member}
            return await _members(request, svc, found, confirm=confirm)
        if op == "remove":
            await svc.workspaces.remove_member(principal, user_id)
        else:
            await svc.users.update(principal, user_id, {"disabled": op == "disable"})
    except BullpenError as err:
        await refused(request, err)
        return await _members(request, svc, found, status=err.status, error=err.detail)
    return _back("/settings/members", {"remove": "removed"}.get(op, op + "d"))


# ------------------------------------------------------------------------ invitations


async def _invitations(
    request: Request,
    svc: Services,
    found: Found,
    *,
    status: int = 200,
    error: str | None = None,
    notice: str | None = None,
    created: InvitationPublic | None = None,
    form: dict[str, str] | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    try:
        mine = await svc.invitations.mine(principal)
        pending = (
            await svc.invitations.pending(principal)
            if principal.can(Permission.MEMBERS_WRITE)
            else []
        )
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    roles = [r for r in Role if r is not Role.OWNER or principal.role is Role.OWNER]
    return await _settings(
        request,
        svc,
        found,
        "settings_invitations.html",
        tab="invitations",
        status=status,
        error=error,
        notice=notice,
        created=created,
        created_json=created.model_dump_json(indent=2) if created else "",
        form=form or {},
        mine=mine,
        pending=pending,
        roles=roles,
    )


@router.get("/settings/invitations", response_class=HTMLResponse, response_model=None)
async def invitations_page(
    request: Request, svc: ServicesDep, done: Annotated[str, Query(max_length=20)] = ""
) -> Response:
    """Invitations to the user; with `members:write`, the workspace's pending ones and a form."""
    found = await page_session(request, svc)
    return await _invitations(request, svc, found, notice=NOTICES.get(done))


@router.post("/ui/settings/invitations", response_model=None)
async def invite(
    request: Request,
    svc: ServicesDep,
    email: Annotated[str, Form(max_length=1000)] = "",
    role: Annotated[str, Form(max_length=20)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Invite an email with a role, as `POST /api/v1/invitations` does; the answer (the same
    for any email) is shown as the API returns it."""
    found = await form_session(request, svc, csrf)
    kept = {"email": email, "role": role}
    try:
        body = InvitationCreate.model_validate({"email": email.strip(), "role": role})
        row = await svc.invitations.invite(found[1].principal, email=body.email, role=body.role)
    except Replayed as replay:
        return await _replayed(request, svc, found, replay.response, kept)
    except ValidationError as err:
        error = _validation_message(err)
        return await _invitations(request, svc, found, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _invitations(
            request, svc, found, status=err.status, error=err.detail, form=kept
        )
    created = InvitationPublic.from_row(row)
    return await _invitations(request, svc, found, status=201, created=created)


@router.post("/ui/settings/invitations/{invitation_id}/{op}", response_model=None)
async def answer_invitation(
    invitation_id: UUID,
    op: str,
    request: Request,
    svc: ServicesDep,
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Revoke one of the workspace's invitations, or accept or decline one to the user."""
    found = await form_session(request, svc, csrf)
    principal = found[1].principal
    try:
        if op == "revoke":
            await svc.invitations.revoke(principal, invitation_id)
        elif op == "accept":
            await svc.invitations.accept(principal, invitation_id)
        elif op == "decline":
            await svc.invitations.decline(principal, invitation_id)
        else:
            raise InvalidInput(f"unknown action {op!r}")
    except BullpenError as err:
        await refused(request, err)
        return await _invitations(request, svc, found, status=err.status, error=err.detail)
    return _back("/settings/invitations", {"revoke": "revoked"}.get(op, op + "ed"))


# --------------------------------------------------------------------------- API keys


async def _keys(
    request: Request,
    svc: Services,
    found: Found,
    *,
    status: int = 200,
    error: str | None = None,
    notice: str | None = None,
    created: ApiKeyCreated | None = None,
    replayed: bool = False,
    form: dict[str, Any] | None = None,
    confirm: ApiKeyPublic | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    if principal.workspace_id == NO_WORKSPACE:
        return await _settings(request, svc, found, "settings_keys.html", tab="keys")
    admin = principal.can(Permission.KEYS_ADMIN)
    try:
        keys = [ApiKeyPublic.from_row(row) for row in await svc.api_keys.list(principal)]
        agents = await svc.agents.list(principal) if admin else []
        people = await svc.workspaces.members(principal, limit=100, after=None) if admin else None
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    owners: dict[UUID, str] = {a.id: f"agent {a.name}" for a in agents}
    owners.update({m.user_id: m.email for m in (people.rows if people else [])})
    # A key may hold what its creator holds: the boxes offered are the caller's permissions.
    grantable = [p for p in Permission if p in principal.permissions]
    return await _settings(
        request,
        svc,
        found,
        "settings_keys.html",
        tab="keys",
        status=status,
        error=error,
        notice=notice,
        created=created,
        replayed=replayed,
        form=form or {},
        confirm=confirm,
        keys=keys,
        now=svc.clock(),
        owners=owners,
        me=principal.user_id,
        admin=admin,
        agents=[a for a in agents if a.status != AgentStatus.TERMINATED],
        grantable=grantable,
        form_id=tokens.new_session_id(),
        expiry_days_max=EXPIRY_DAYS_MAX,
        limit_max=LIMIT_MAX,
    )


@router.get("/settings/api-keys", response_class=HTMLResponse, response_model=None)
async def keys_page(
    request: Request, svc: ServicesDep, done: Annotated[str, Query(max_length=20)] = ""
) -> Response:
    """The caller's API keys (every key of the workspace with `keys:admin`), never the keys
    themselves: their prefix only."""
    found = await page_session(request, svc)
    return await _keys(request, svc, found, notice=NOTICES.get(done))


def _whole(text: str, field: str, low: int, high: int) -> int | None:
    """A form's optional whole number, or InvalidInput naming the field."""
    text = text.strip()
    if not text:
        return None
    if not text.isdecimal() or not low <= int(text) <= high:
        raise InvalidInput(f"{field}: a whole number from {low} to {high}, or empty")
    return int(text)


def _key_body(form: dict[str, str], scopes: list[str], svc: Services) -> dict[str, Any]:
    """The API's create body from the form (checked by `ApiKeyCreate` next)."""
    days = _whole(form.get("expires_in_days", ""), "expires_in_days", 1, EXPIRY_DAYS_MAX)
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "scopes": scopes or ["*"],
        "rpm_limit": _whole(form.get("rpm_limit", ""), "rpm_limit", 1, LIMIT_MAX),
        "tpm_limit": _whole(form.get("tpm_limit", ""), "tpm_limit", 1, LIMIT_MAX),
    }
    if days is not None:
        body["expires_at"] = (svc.clock() + timedelta(days=days)).isoformat()
    if form.get("agent_id"):
        body["agent_id"] = form["agent_id"]
    return body


@router.post("/ui/settings/api-keys", response_model=None)
async def create_key(request: Request, svc: ServicesDep) -> Response:
    """Create a key as `POST /api/v1/api-keys` does and show it this once. The form's
    one-time token is its Idempotency-Key: sending the form again (a reload) replays the
    first answer, whose key is not stored, so it is never shown a second time."""
    form, scopes = await _form(request)
    found = await form_session(request, svc, form.get("csrf", "")[:128])
    principal = found[1].principal
    kept: dict[str, Any] = {k: v for k, v in form.items() if k not in {"csrf", "form_id"}}
    kept["scopes"] = scopes
    try:
        check_key(form.get("form_id") or None)
        body = ApiKeyCreate.model_validate(_key_body(form, scopes, svc))
        write = IdempotentWrite(
            svc,
            form.get("form_id") or None,
            route=CREATE_KEY,
            # The form as sent (not the expiry computed from it, which moves with the clock).
            body=_fixed(orjson.dumps(kept, option=orjson.OPT_SORT_KEYS)),
            instance="/ui/settings/api-keys",
        )
        async with write.begin(principal) as tx:
            row, key = await svc.api_keys.create(
                principal,
                name=body.name,
                scopes=[str(scope) for scope in body.scopes],
                expires_at=body.expires_at,
                agent_id=body.agent_id,
                rpm_limit=body.rpm_limit,
                tpm_limit=body.tpm_limit,
            )
            public = ApiKeyPublic.from_row(row).model_dump()
            tx.respond(201, ApiKeyCreated(**public, key=None))
    except Replayed as replay:
        return await _replayed(request, svc, found, replay.response, kept)
    except ValidationError as err:
        error = _validation_message(err)
        return await _keys(request, svc, found, status=422, error=error, form=kept)
    except BullpenError as err:
        await refused(request, err)
        return await _keys(request, svc, found, status=err.status, error=err.detail, form=kept)
    created = ApiKeyCreated(**public, key=key)
    return await _keys(request, svc, found, status=201, created=created)


async def _replayed(
    request: Request, svc: Services, found: Found, replay: Response, kept: dict[str, Any]
) -> HTMLResponse:
    """A form sent again: a refusal stored the first time reads the same; a created key is
    not shown again (it was never stored)."""
    if replay.status_code >= 400:
        detail = str(orjson.loads(replay.body).get("detail", ""))
        return await _keys(request, svc, found, status=replay.status_code, error=detail, form=kept)
    return await _keys(request, svc, found, replayed=True)


def _fixed(body: bytes) -> Any:
    async def read() -> bytes:
        return body

    return read


@router.post("/ui/settings/api-keys/{key_id}/revoke", response_model=None)
async def revoke_key(
    key_id: UUID,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Revoke a key as `DELETE /api/v1/api-keys/{id}` does, after a confirmation."""
    found = await form_session(request, svc, csrf)
    principal = found[1].principal
    try:
        row = await svc.api_keys.get(principal, key_id)
        if confirmed != "yes":
            return await _keys(request, svc, found, confirm=ApiKeyPublic.from_row(row))
        await svc.api_keys.revoke(principal, key_id)
    except BullpenError as err:
        await refused(request, err)
        return await _keys(request, svc, found, status=err.status, error=err.detail)
    return _back("/settings/api-keys", "key_revoked")
