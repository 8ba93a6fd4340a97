"""The web UI: sign in, create a task, watch it stream (server-rendered, no build step)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from bullpen.api.deps import SESSION_COOKIE, ServicesDep, check_same_site
from bullpen.api.schemas import TaskCreate
from bullpen.app import Services
from bullpen.errors import BullpenError, Forbidden, RateLimited, Unauthenticated
from bullpen.services.auth import SessionPrincipal
from bullpen.store import agents as agent_store

WEB = Path(__file__).resolve().parents[2] / "web"
templates = Jinja2Templates(directory=WEB / "templates")

router = APIRouter(include_in_schema=False)


async def _session(request: Request, svc: Services) -> tuple[str, SessionPrincipal] | None:
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id:
        return None
    try:
        return session_id, await svc.auth.authenticate_session(session_id)
    except Unauthenticated:
        return None


def _render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    """The sign-in form."""
    return _render(request, "login.html", error=None)


@router.post("/login", response_model=None)
async def login(
    request: Request,
    svc: ServicesDep,
    email: Annotated[str, Form(max_length=320)],
    password: Annotated[str, Form(max_length=1024)],
) -> Response:
    """Check the password, start a fresh session, go to the dashboard."""
    check_same_site(request)
    client = request.client.host if request.client else "unknown"
    try:
        session_id = await svc.auth.sign_in(email, password, client=client)
    except Unauthenticated:
        return _render(request, "login.html", status=401, error="Wrong email or password.")
    except RateLimited as err:
        refused = _render(request, "login.html", status=429, error=err.detail + ".")
        refused.headers["Retry-After"] = str(max(1, round(err.retry_after or 1)))
        return refused
    old = request.cookies.get(SESSION_COOKIE)
    if old:
        await svc.auth.sign_out(old)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
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
    check_same_site(request)
    found = await _session(request, svc)
    if found is not None:
        session_id, _ = found
        if not svc.auth.check_csrf(session_id, csrf):
            raise Forbidden("missing or wrong CSRF token")
        await svc.auth.sign_out(session_id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/", response_class=HTMLResponse, response_model=None)
async def dashboard(request: Request, svc: ServicesDep) -> Response:
    """Create a task; see recent ones."""
    found = await _session(request, svc)
    if found is None:
        return RedirectResponse("/login", status_code=303)
    return await _dashboard(request, svc, found)


async def _dashboard(
    request: Request,
    svc: Services,
    found: tuple[str, SessionPrincipal],
    *,
    status: int = 200,
    error: str | None = None,
    prompt: str = "",
) -> HTMLResponse:
    session_id, who = found
    async with svc.store.read() as conn:
        agents = await agent_store.list_agents(conn, who.principal.workspace_id)
    page, _runs = await svc.tasks.list(who.principal, limit=20, after=None, status=None)
    return _render(
        request,
        "dashboard.html",
        status=status,
        email=who.email,
        csrf=svc.auth.csrf_token(session_id),
        agents=agents,
        tasks=page.rows,
        error=error,
        prompt=prompt,
    )


@router.post("/ui/tasks", response_model=None)
async def create_task(
    request: Request,
    svc: ServicesDep,
    prompt: Annotated[str, Form(max_length=10_000)] = "",
    agent_id: Annotated[str, Form(max_length=64)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Create a task from the dashboard form and open its live page."""
    check_same_site(request)
    found = await _session(request, svc)
    if found is None:
        return RedirectResponse("/login", status_code=303)
    session_id, who = found
    if not svc.auth.check_csrf(session_id, csrf):
        raise Forbidden("missing or wrong CSRF token")
    try:
        body = TaskCreate.model_validate({"prompt": prompt, "agent_id": agent_id})
        task, _ = await svc.tasks.create(who.principal, prompt=body.prompt, agent_id=body.agent_id)
    except ValidationError as err:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        return await _dashboard(request, svc, found, status=422, error=message, prompt=prompt)
    except BullpenError as err:
        return await _dashboard(
            request, svc, found, status=err.status, error=err.detail, prompt=prompt
        )
    return RedirectResponse(f"/tasks/{task.id}", status_code=303)


@router.get("/tasks/{task_id}", response_class=HTMLResponse, response_model=None)
async def task_page(task_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """A task's live page: its tokens arrive over SSE."""
    found = await _session(request, svc)
    if found is None:
        return RedirectResponse("/login", status_code=303)
    session_id, who = found
    task, run = await svc.tasks.get(who.principal, task_id)
    return _render(
        request,
        "task.html",
        email=who.email,
        csrf=svc.auth.csrf_token(session_id),
        task=task,
        run=run,
    )
