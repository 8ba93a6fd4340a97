"""The web UI: sign in, create a task, watch it stream, change the password (server-rendered)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from bullpen.api.deps import (
    SECURE_SESSION_COOKIE,
    SESSION_COOKIE,
    ServicesDep,
    audit_denial,
    check_same_site,
    session_cookie_name,
)
from bullpen.app import Services
from bullpen.domain import tokens
from bullpen.domain.access import Permission
from bullpen.errors import (
    BullpenError,
    Forbidden,
    NotFound,
    RateLimited,
    Unauthenticated,
    Unavailable,
)
from bullpen.services.auth import SessionPrincipal

WEB = Path(__file__).resolve().parents[2] / "web"
templates = Jinja2Templates(directory=WEB / "templates")

router = APIRouter(include_in_schema=False)

PASSWORD_MIN, PASSWORD_MAX = 12, 1024
# Notices the sign-in page shows for `?done=<key>`: fixed texts, never reflected input.
NOTICES = {"password": "Password changed. Sign in with your new password."}

# Issue 19, finding 9 (login CSRF): before there is a session, the sign-in page gives the
# browser a random nonce in this cookie and the form a token derived from it (HMAC with the
# server's secret); a sign-in must bring both, matching, on top of Fetch Metadata.
LOGIN_COOKIE = "bullpen_login"
LOGIN_COOKIE_MAX_AGE_S = 86_400
_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")  # tokens.new_session_id()'s shape
EXPIRED_FORM = "This sign-in form has expired. Please sign in again."
BUSY = "Sign-in is busy right now. Try again in a moment."


class SignedOut(Exception):
    """A page or form request without a live session: the app answers it with a redirect to
    the sign-in page (`signed_out`)."""


def signed_out(_request: Request, _exc: Exception) -> Response:
    """`SignedOut`'s answer: the sign-in page."""
    return RedirectResponse("/login", status_code=303)


async def page_session(request: Request, svc: Services) -> tuple[str, SessionPrincipal]:
    """The signed-in user of a page request, admitted as the API would (rate limits); raises
    `SignedOut` without one."""
    found = await _signed_in(request, svc)
    if found is None:
        raise SignedOut
    _admit(request, svc, found[1])
    return found


async def _signed_in(request: Request, svc: Services) -> tuple[str, SessionPrincipal] | None:
    session_id = request.cookies.get(session_cookie_name(request))
    if not session_id:
        return None
    try:
        return session_id, await svc.auth.authenticate_session(session_id)
    except Unauthenticated:
        return None


def _admit(request: Request, svc: Services, who: SessionPrincipal) -> None:
    """What the API does for every caller: spend its request budget (the same buckets as its
    API calls) and name it, so a refusal it then gets is audited."""
    principal = who.principal
    svc.limits.take(principal.scope_id, str(principal.workspace_id))
    request.state.principal = principal


async def form_session(request: Request, svc: Services, csrf: str) -> tuple[str, SessionPrincipal]:
    """The session behind a form posted from this site's own page; raises `SignedOut`
    without one.

    A post from another site, or without the session's own CSRF token, is Forbidden.
    """
    check_same_site(request)
    found = await _signed_in(request, svc)
    if found is None:
        raise SignedOut
    if not svc.auth.check_csrf(found[0], csrf):
        raise Forbidden("missing or wrong CSRF token")
    _admit(request, svc, found[1])
    return found


async def refused(request: Request, err: BullpenError) -> None:
    """Audit a 403 that a form shows on its own page, as the API's error handler would."""
    if err.status == 403:
        await audit_denial(request, err.detail)


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A template as an HTML response."""
    return templates.TemplateResponse(request, name, context, status_code=status)


Found = tuple[str, SessionPrincipal]


async def page(
    request: Request,
    svc: Services,
    found: Found,
    name: str,
    *,
    section: str,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    """A signed-in page: the layout's navigation, session and workspace switcher, and what
    the caller's role may do (`can`), for the template to show only that; the server refuses
    the rest whatever the page shows."""
    session_id, who = found
    # A user in no workspace yet is offered those it has joined since (an invitation accepted).
    workspaces = await svc.workspaces.mine(who.principal)
    return render(
        request,
        name,
        status=status,
        email=who.email,
        csrf=svc.auth.csrf_token(session_id),
        workspaces=workspaces,
        can=who.principal.can,
        P=Permission,
        section=section,
        **context,
    )


async def message(
    request: Request, svc: Services, found: Found, err: BullpenError, *, section: str
) -> HTMLResponse:
    """A refusal or a missing object as a page with the error's status (403s audited)."""
    await refused(request, err)
    return await page(
        request, svc, found, "message.html", section=section, status=err.status, error=err.detail
    )


def _end_session_cookie(response: Response) -> Response:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="lax")
    # Browsers take a `__Host-` cookie (this deletion too) only with Secure: ignored over http.
    response.delete_cookie(
        SECURE_SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=True
    )
    return response


def _too_many(page: HTMLResponse, err: RateLimited) -> HTMLResponse:
    page.headers["Retry-After"] = str(_wait_s(err))
    return page


def _wait_s(err: BullpenError) -> int:
    return max(1, math.ceil(err.retry_after or 1))


def _wait_message(err: RateLimited) -> str:
    minutes = math.ceil(_wait_s(err) / 60)
    return f"Too many failed attempts. Try again in {minutes} minute{'s' * (minutes != 1)}."


def _login_nonce(request: Request) -> str | None:
    nonce = request.cookies.get(LOGIN_COOKIE, "")
    return nonce if _NONCE.fullmatch(nonce) else None


def _login_page(
    request: Request,
    svc: Services,
    *,
    status: int = 200,
    error: str | None = None,
    notice: str | None = None,
) -> HTMLResponse:
    """The sign-in form, with this browser's nonce cookie (kept, or a new one; its lifetime
    renewed) and its token."""
    nonce = _login_nonce(request) or tokens.new_session_id()
    page = render(
        request,
        "login.html",
        status=status,
        error=error,
        notice=notice,
        login_csrf=svc.auth.login_token(nonce),
    )
    page.set_cookie(
        LOGIN_COOKIE,
        nonce,
        max_age=LOGIN_COOKIE_MAX_AGE_S,
        httponly=True,
        # Never sent with a request another site starts, not even a top-level POST.
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/login",
    )
    return page


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, svc: ServicesDep, done: str = "") -> HTMLResponse:
    """The sign-in form."""
    return _login_page(request, svc, notice=NOTICES.get(done))


@router.post("/login", response_model=None)
async def login(
    request: Request,
    svc: ServicesDep,
    email: Annotated[str, Form(max_length=320)],
    password: Annotated[str, Form(max_length=1024)],
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Check the password, start a fresh session, go to the dashboard."""
    check_same_site(request)
    if not svc.auth.check_login_token(_login_nonce(request) or "", csrf):
        # Login CSRF, or a page older than its cookie: nothing is checked or counted; a
        # person just submits the fresh form again.
        return _login_page(request, svc, status=403, error=EXPIRED_FORM)
    client = request.client.host if request.client else "unknown"
    try:
        session_id = await svc.auth.sign_in(email, password, client=client)
    except Unauthenticated:
        # Unknown email, wrong password, disabled user: one answer, byte for byte.
        return _login_page(request, svc, status=401, error="Wrong email or password.")
    except RateLimited as err:
        page = _login_page(request, svc, status=429, error=_wait_message(err))
        return _too_many(page, err)
    except Unavailable as err:
        page = _login_page(request, svc, status=503, error=BUSY)
        page.headers["Retry-After"] = str(_wait_s(err))
        return page
    # A fresh id on every sign-in; whatever session this browser had before ends here.
    old = request.cookies.get(session_cookie_name(request))
    if old:
        await svc.auth.sign_out(old)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        session_cookie_name(request),
        session_id,
        max_age=int(svc.auth.session_ttl.total_seconds()),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout", response_model=None)
async def logout(
    request: Request, svc: ServicesDep, csrf: Annotated[str, Form(max_length=128)] = ""
) -> Response:
    """End the session."""
    found = await form_session(request, svc, csrf)
    if found is not None:
        await svc.auth.sign_out(found[0])
    return _end_session_cookie(RedirectResponse("/login", status_code=303))


@router.post("/ui/workspace", response_model=None)
async def switch_workspace(
    request: Request,
    svc: ServicesDep,
    workspace_id: Annotated[str, Form(max_length=64)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Act in another of the user's workspaces (the header's picker), then show it."""
    found = await form_session(request, svc, csrf)
    session_id, who = found
    try:
        target = UUID(workspace_id)
        entry = await svc.workspaces.membership(who.principal, target)
    except (ValueError, BullpenError):
        return await message(request, svc, found, NotFound("No such workspace."), section="")
    await svc.auth.switch_workspace(session_id, who.principal, entry.id)
    return RedirectResponse("/", status_code=303)


@router.get("/account", response_class=HTMLResponse, response_model=None)
async def account_page(request: Request, svc: ServicesDep) -> Response:
    """The signed-in user's account: change the password."""
    found = await page_session(request, svc)
    return await _account(request, svc, found)


async def _account(
    request: Request,
    svc: Services,
    found: tuple[str, SessionPrincipal],
    *,
    status: int = 200,
    error: str | None = None,
) -> HTMLResponse:
    return await page(
        request,
        svc,
        found,
        "account.html",
        section="settings",
        status=status,
        error=error,
        password_min=PASSWORD_MIN,
        password_max=PASSWORD_MAX,
    )


@router.post("/ui/account/password", response_model=None)
async def change_password(
    request: Request,
    svc: ServicesDep,
    # Generous bounds, so a too-long password gets the form's own message, not a bare 422.
    current_password: Annotated[str, Form(max_length=4 * PASSWORD_MAX)] = "",
    new_password: Annotated[str, Form(max_length=4 * PASSWORD_MAX)] = "",
    confirm: Annotated[str, Form(max_length=4 * PASSWORD_MAX)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Check the current password, store the new one, end every session of the user."""
    found = await form_session(request, svc, csrf)
    _, who = found
    if not PASSWORD_MIN <= len(new_password) <= PASSWORD_MAX:
        error = f"The new password needs {PASSWORD_MIN} to {PASSWORD_MAX} characters."
        return await _account(request, svc, found, status=422, error=error)
    if new_password != confirm:
        error = "The new password and its confirmation differ."
        return await _account(request, svc, found, status=422, error=error)
    try:
        await svc.users.change_password(who.principal, current_password, new_password)
    except RateLimited as err:
        page_ = await _account(request, svc, found, status=429, error=_wait_message(err))
        return _too_many(page_, err)
    except Forbidden as err:
        await refused(request, err)
        return await _account(
            request, svc, found, status=403, error="The current password is wrong."
        )
    return _end_session_cookie(RedirectResponse("/login?done=password", status_code=303))
