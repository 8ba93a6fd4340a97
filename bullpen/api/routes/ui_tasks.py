"""The dashboard's task pages: the filtered, live list with bulk cancel and the create form,
and a task's page with its run timeline, subtasks, blockers, comments and actions.

Every read and change goes through the task service, as the API's do; the forms bring the
session's CSRF token and are refused from another site (`form_session`).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from bullpen.api import cursor
from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import (
    Found,
    form_session,
    message,
    page,
    page_session,
    refused,
    render,
)
from bullpen.api.schemas.tasks import CommentCreate, TaskCreate
from bullpen.app import Services
from bullpen.domain.access import Permission
from bullpen.domain.principal import NO_WORKSPACE
from bullpen.domain.status import TaskStatus
from bullpen.errors import BullpenError, InvalidInput
from bullpen.store import changes as change_log
from bullpen.streams.changes import cursor_id

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50  # tasks per page of the list
BULK_MAX = 100  # tasks one bulk cancel may name (a page's worth, and then some)
TIMELINE_EVENTS = 2000  # status, tool and error events a task page shows
COMMENTS_SHOWN = 200
SEARCH_MAX = 200
# The trigram indexes serve a search of 3 characters or more (migration 0020); a shorter one
# could only read every task, and finds little a longer one would not.
SEARCH_MIN = 3
SECTION = "tasks"


def _uuid(value: str, field: str) -> UUID | None:
    if not value:
        return None
    try:
        return UUID(value)
    except ValueError as err:
        raise InvalidInput(f"{field}: not a task or agent id") from err


class Filters:
    """The list's filters, from the query string; empty values are no filter."""

    def __init__(
        self, status: str, agent: str, label: str, level: str, parent: str, q: str
    ) -> None:
        if status and status not in {s.value for s in TaskStatus}:
            raise InvalidInput(f"status: unknown status {status!r}")
        if level not in {"", "top"}:
            raise InvalidInput("level: only `top` (tasks without a parent) is known")
        if len(q) > SEARCH_MAX or len(label) > 50:
            raise InvalidInput(f"search: at most {SEARCH_MAX} characters, a label at most 50")
        if 0 < len(q.strip()) < SEARCH_MIN:
            raise InvalidInput(f"search: at least {SEARCH_MIN} characters")
        self.status, self.agent, self.label, self.level, self.parent, self.q = (
            status,
            agent,
            label.strip(),
            level,
            parent,
            q.strip(),
        )
        self.agent_id = _uuid(agent, "agent")
        self.parent_id = _uuid(parent, "parent")

    @property
    def any(self) -> bool:
        """Whether any filter is set (new tasks then do not join the live list)."""
        return bool(self.status or self.agent or self.label or self.level or self.parent or self.q)

    def query(self, **more: str) -> str:
        """The filters (and `more`) as a query string, empty values left out."""
        values = {
            "status": self.status,
            "agent": self.agent,
            "label": self.label,
            "level": self.level,
            "parent": self.parent,
            "q": self.q,
            **more,
        }
        return urlencode({k: v for k, v in values.items() if v})


@router.get("/", response_class=HTMLResponse, response_model=None)
async def tasks_page(
    request: Request,
    svc: ServicesDep,
    status: str = "",
    agent: str = "",
    label: str = "",
    level: str = "",
    parent: str = "",
    q: str = "",
    cancelled: int = -1,
) -> Response:
    """The task list: filters, search, keyset pages, bulk cancel, and the create form."""
    found = await page_session(request, svc)
    page_cursor = request.query_params.get("cursor", "")
    try:
        filters = Filters(status, agent, label, level, parent, q)
    except InvalidInput as err:
        return await message(request, svc, found, err, section=SECTION)
    return await _tasks(request, svc, found, filters, page_cursor, cancelled=cancelled)


async def _tasks(
    request: Request,
    svc: Services,
    found: Found,
    filters: Filters,
    page_cursor: str = "",
    *,
    status: int = 200,
    error: str | None = None,
    form: dict[str, Any] | None = None,
    cancelled: int = -1,
) -> HTMLResponse:
    _, who = found
    principal = who.principal
    async with svc.store.read() as conn:
        # Read before the list: the page's live updates start here, so none falls between.
        live_from = await change_log.head(conn, principal.workspace_id)
    agents = await svc.agents.list(principal) if principal.workspace_id != NO_WORKSPACE else []
    rows: list[Any] = []
    next_cursor = None
    if principal.workspace_id != NO_WORKSPACE:  # in none yet: nothing to list
        try:
            listed, _runs = await svc.tasks.list(
                principal,
                limit=PAGE_SIZE,
                after=cursor.after(page_cursor or None),
                status=filters.status or None,
                agent_id=filters.agent_id,
                label=filters.label or None,
                parent_id=filters.parent_id,
                top_level=filters.level == "top",
                search=filters.q or None,
            )
        except BullpenError as err:
            return await message(request, svc, found, err, section=SECTION)
        rows = list(listed.rows)
        next_cursor = cursor.next_of(listed)
    context: dict[str, Any] = {
        "tasks": rows,
        "agents": agents,
        "agent_names": {a.id: a.name for a in agents},
        "filters": filters,
        "statuses": [s.value for s in TaskStatus],
        "next_url": f"/?{filters.query(cursor=next_cursor)}" if next_cursor else None,
        "first_page": not page_cursor,
        "live_from": cursor_id(live_from).decode(),
        "return_to": f"/?{filters.query(cursor=page_cursor)}",
        "cancelled": cancelled,
    }
    if request.headers.get("hx-request") == "true" and form is None:
        return render(
            request, "tasks_list.html", status=status, can=principal.can, P=Permission, **context
        )
    return await page(
        request,
        svc,
        found,
        "tasks.html",
        section=SECTION,
        status=status,
        error=error,
        form=form or {},
        **context,
    )


def _integer(text: str) -> int | str:
    """A form's whole number as the API receives it (other text is left to be refused)."""
    try:
        return int(text.strip())
    except ValueError:
        return text


def _list_of(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def _validation_message(err: ValidationError) -> str:
    """The API's field errors (`loc: msg`), as one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())


@router.post("/ui/tasks", response_model=None)
async def create_task(
    request: Request,
    svc: ServicesDep,
    prompt: Annotated[str, Form(max_length=10_000)] = "",
    agent_id: Annotated[str, Form(max_length=64)] = "",
    title: Annotated[str, Form(max_length=1_000)] = "",
    priority: Annotated[str, Form(max_length=20)] = "0",
    labels: Annotated[str, Form(max_length=2_000)] = "",
    parent_id: Annotated[str, Form(max_length=64)] = "",
    blocked_by: Annotated[list[str] | None, Form(max_length=64)] = None,
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Create a task from the form, as the API would, and open its live page."""
    found = await form_session(request, svc, csrf)
    _, who = found
    form = {
        "prompt": prompt,
        "agent_id": agent_id,
        "title": title,
        "priority": priority,
        "labels": labels,
        "parent_id": parent_id,
        "blocked_by": blocked_by or [],
    }
    body: dict[str, Any] = {
        "prompt": prompt,
        "agent_id": agent_id,
        "priority": _integer(priority or "0"),
        "labels": _list_of(labels),
        "blocked_by": [b for b in (blocked_by or []) if b],
    }
    if title.strip():
        body["title"] = title
    if parent_id:
        body["parent_id"] = parent_id
    no_filters = Filters("", "", "", "", "", "")
    try:
        task_in = TaskCreate.model_validate(body)
        task, _ = await svc.tasks.create(
            who.principal,
            prompt=task_in.prompt,
            agent_id=task_in.agent_id,
            title=task_in.title,
            priority=task_in.priority,
            labels=task_in.labels,
            parent_id=task_in.parent_id,
            blocked_by=task_in.blocked_by,
        )
    except ValidationError as err:
        return await _tasks(
            request, svc, found, no_filters, status=422, error=_validation_message(err), form=form
        )
    except BullpenError as err:
        await refused(request, err)
        return await _tasks(
            request, svc, found, no_filters, status=err.status, error=err.detail, form=form
        )
    return RedirectResponse(f"/tasks/{task.id}", status_code=303)


def _back(return_to: str) -> str:
    """A same-site path of the task list to return to (anything else: the list's top)."""
    return return_to if return_to.startswith("/?") or return_to == "/" else "/"


@router.post("/ui/tasks/cancel", response_model=None)
async def cancel_tasks(
    request: Request,
    svc: ServicesDep,
    task_id: Annotated[list[str] | None, Form(max_length=64)] = None,
    return_to: Annotated[str, Form(max_length=2_000)] = "/",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Cancel the selected tasks (and their subtasks), each as the API's cancel does."""
    found = await form_session(request, svc, csrf)
    _, who = found
    chosen = task_id or []
    try:
        if len(chosen) > BULK_MAX:
            raise InvalidInput(f"at most {BULK_MAX} tasks at once")
        ids = [UUID(value) for value in chosen]
    except (ValueError, InvalidInput) as err:
        bad = err if isinstance(err, InvalidInput) else InvalidInput("task_id: not a task id")
        return await message(request, svc, found, bad, section=SECTION)
    done = 0
    for one in ids:
        try:
            await svc.tasks.cancel(who.principal, one)
            done += 1
        except BullpenError as err:
            if err.status == 403:  # a role that may not: the whole request is refused
                return await message(request, svc, found, err, section=SECTION)
            # Ended meanwhile, or gone: the others are still cancelled.
    back = _back(return_to)
    joiner = "&" if "?" in back and not back.endswith("?") else ("" if back.endswith("?") else "?")
    return RedirectResponse(f"{back}{joiner}cancelled={done}", status_code=303)


@router.get("/tasks/{task_id}", response_class=HTMLResponse, response_model=None)
async def task_page(task_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """A task's live page: output over SSE, its runs' timeline, subtasks, comments."""
    found = await page_session(request, svc)
    return await _task(request, svc, found, task_id)


async def _task(
    request: Request,
    svc: Services,
    found: Found,
    task_id: UUID,
    *,
    status: int = 200,
    error: str | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    async with svc.store.read() as conn:  # before the page's reads: the live tree starts here
        live_from = await change_log.head(conn, principal.workspace_id)
    try:
        task, run = await svc.tasks.get(principal, task_id)
        runs, steps = await svc.tasks.timeline(principal, task_id, limit=TIMELINE_EVENTS)
        children, blockers = await svc.tasks.dependencies(principal, task_id)
        comments = await svc.tasks.comments(principal, task_id, limit=COMMENTS_SHOWN, after=None)
        agents = await svc.agents.list(principal)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    by_run: dict[UUID, list[Any]] = {}
    for event in steps:
        by_run.setdefault(event.run_id, []).append(event)
    return await page(
        request,
        svc,
        found,
        "task.html",
        section=SECTION,
        status=status,
        error=error,
        task=task,
        run=run,
        runs=runs,
        steps=by_run,
        children=children,
        blockers=blockers,
        comments=comments.rows,
        agent_names={a.id: a.name for a in agents},
        live_from=cursor_id(live_from).decode(),
        ended=task.status in {TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED},
    )


@router.post("/ui/tasks/{task_id}/{action}", response_model=None)
async def task_action(
    task_id: UUID,
    action: str,
    request: Request,
    svc: ServicesDep,
    body: Annotated[str, Form(max_length=20_000)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Cancel, retry or comment on a task from its page."""
    found = await form_session(request, svc, csrf)
    principal = found[1].principal
    try:
        if action == "cancel":
            await svc.tasks.cancel(principal, task_id)
        elif action == "retry":
            await svc.tasks.retry(principal, task_id)
        elif action == "comment":
            comment = CommentCreate.model_validate({"body": body})
            await svc.tasks.comment(principal, task_id, comment.body)
        else:
            return await message(
                request, svc, found, InvalidInput(f"unknown action {action!r}"), section=SECTION
            )
    except ValidationError as err:
        error = _validation_message(err)
        return await _task(request, svc, found, task_id, status=422, error=error)
    except BullpenError as err:
        await refused(request, err)
        return await _task(request, svc, found, task_id, status=err.status, error=err.detail)
    return RedirectResponse(f"/tasks/{task_id}", status_code=303)
