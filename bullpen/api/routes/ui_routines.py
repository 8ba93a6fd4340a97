"""The dashboard's routines page: every routine with its schedule and next fire, a create form
that previews the next five fire times before saving (a button that works without
JavaScript, and with htmx as you type), and a routine's page with its fire history, fire now,
pause, resume, delete, and an edit form of the same fields and preview.

Every read and change goes through the routine service, as the API's do; the create and edit
forms are checked by the API's own schemas (`RoutineCreate`, `RoutineUpdate`) and schedule
rules, so a bad cron expression or time zone reads as the API would say it. An edit sends the
API's update only the fields that differ from the routine's.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import TypeAdapter, ValidationError

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
from bullpen.api.schemas.routines import (
    CatchUp,
    Concurrency,
    Cron,
    RoutineCreate,
    RoutineUpdate,
    TimeZone,
)
from bullpen.app import Services
from bullpen.domain.access import Permission, need
from bullpen.domain.records import RoutineRecord
from bullpen.errors import BullpenError, InvalidInput
from bullpen.services.routines import PREVIEW_SLOTS, next_slots, zones

router = APIRouter(include_in_schema=False)

SECTION = "routines"
PAGE_SIZE = 50  # routines a page lists
FIRES_SHOWN = 50  # latest fires a routine's page lists
_CRON = TypeAdapter(Cron)
_ZONE = TypeAdapter(TimeZone)


@dataclass(frozen=True, slots=True)
class Slot:
    """A fire time, in the routine's zone and in UTC."""

    local: datetime
    utc: datetime


@dataclass(frozen=True, slots=True)
class Preview:
    """The next fire times of a schedule, or why it has none."""

    cron: str
    timezone: str
    slots: list[Slot]
    error: str | None = None


def _validation_message(err: ValidationError, field: str | None = None) -> str:
    """The API's field errors (`loc: msg`), as one line."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or field}: {e['msg']}" for e in err.errors())


def preview(svc: Services, cron: str, timezone: str) -> Preview:
    """The next five fire times, checked as a create would check the two fields."""
    cron, timezone = cron.strip(), timezone.strip() or "UTC"
    try:
        try:
            _CRON.validate_python(cron)
        except ValidationError as err:
            raise InvalidInput(_validation_message(err, "cron")) from None
        try:
            _ZONE.validate_python(timezone)
        except ValidationError as err:
            raise InvalidInput(_validation_message(err, "timezone")) from None
        slots = next_slots(cron, timezone, svc.clock())
    except InvalidInput as err:
        return Preview(cron, timezone, [], err.detail)
    zone = zoneinfo.ZoneInfo(timezone)
    return Preview(cron, timezone, [Slot(s.astimezone(zone), s) for s in slots])


async def _form(request: Request) -> dict[str, str]:
    data = await request.form()
    return {k: v for k, v in data.items() if isinstance(v, str)}


async def _routines(
    request: Request,
    svc: Services,
    found: Found,
    *,
    page_cursor: str = "",
    status: int = 200,
    error: str | None = None,
    form: dict[str, str] | None = None,
    shown: Preview | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    try:
        listed = await svc.routines.list(
            principal, limit=PAGE_SIZE, after=cursor.after(page_cursor or None)
        )
        agents = await svc.agents.list(principal)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    next_cursor = cursor.next_of(listed)
    return await page(
        request,
        svc,
        found,
        "routines.html",
        section=SECTION,
        status=status,
        error=error,
        form=form or {"timezone": "UTC", "enabled": "on"},
        routines=listed.rows,
        agents=agents,
        names={a.id: a.name for a in agents},
        next_url=f"/routines?cursor={next_cursor}" if next_cursor else None,
        preview=shown,
        zones=zones(),
        preview_slots=PREVIEW_SLOTS,
        concurrency=[c.value for c in Concurrency],
        catch_up=[c.value for c in CatchUp],
    )


@router.get("/routines", response_class=HTMLResponse, response_model=None)
async def routines_page(request: Request, svc: ServicesDep) -> Response:
    """Every routine with its schedule and next fire; the create form with its preview."""
    found = await page_session(request, svc)
    return await _routines(
        request, svc, found, page_cursor=request.query_params.get("cursor", "")[:200]
    )


@router.get("/ui/routines/preview", response_class=HTMLResponse, response_model=None)
async def preview_fragment(
    request: Request, svc: ServicesDep, cron: str = "", timezone: str = ""
) -> Response:
    """The preview box alone, for htmx as the schedule is typed (an error is its content)."""
    await page_session(request, svc)  # signed in, or the sign-in page
    if len(cron) > 400 or len(timezone) > 200:
        shown = Preview(cron[:400], timezone[:200], [], "cron or timezone: too long")
    else:
        shown = preview(svc, cron, timezone)
    return render(request, "_routine_preview.html", preview=shown, preview_slots=PREVIEW_SLOTS)


def _labels(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


def _integer(text: str) -> int | str:
    try:
        return int(text.strip())
    except ValueError:
        return text


def _fields(form: dict[str, str]) -> dict[str, Any]:
    """A routine's form as the API's JSON body would carry it (checked by the API's schema)."""
    return {
        "name": form.get("name", "").strip(),
        "agent_id": form.get("agent_id", ""),
        "cron": form.get("cron", "").strip(),
        "timezone": form.get("timezone", "").strip() or "UTC",
        "prompt": form.get("prompt", ""),
        "title": form.get("title", "").strip() or None,
        "priority": _integer(form.get("priority", "") or "0"),
        "labels": _labels(form.get("labels", "")),
        "concurrency": form.get("concurrency", "skip"),
        "catch_up": form.get("catch_up", "latest"),
        "enabled": form.get("enabled") == "on",
    }


def _form_of(routine: RoutineRecord) -> dict[str, str]:
    """A routine's settings as its edit form's fields."""
    return {
        "name": routine.name,
        "agent_id": str(routine.agent_id),
        "cron": routine.cron,
        "timezone": routine.timezone,
        "prompt": routine.prompt,
        "title": routine.title or "",
        "priority": str(routine.priority),
        "labels": ", ".join(routine.labels),
        "concurrency": routine.concurrency,
        "catch_up": routine.catch_up,
        "enabled": "on" if routine.enabled else "",
    }


def _changes(form: dict[str, str], routine: RoutineRecord) -> dict[str, Any]:
    """The fields the form sets to something else than the routine has (a field the post does
    not carry is left as it is), as the API's update body."""
    sent, kept = _fields(form), _fields(_form_of(routine))
    changes = {k: v for k, v in sent.items() if k in form and v != kept[k]}
    if "title" in changes and changes["title"] is None:
        changes["title"] = ""  # a title emptied: the API's own refusal (it takes no null)
    return changes


@router.post("/ui/routines", response_model=None)
async def create_routine(request: Request, svc: ServicesDep) -> Response:
    """Create a routine, or (the Preview button) show its next five fire times first."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    kept = {k: v for k, v in form.items() if k not in {"csrf", "action"}}
    shown = preview(svc, form.get("cron", ""), form.get("timezone", ""))
    if form.get("action") == "preview":
        return await _routines(
            request,
            svc,
            found,
            status=422 if shown.error else 200,
            form=kept,
            shown=shown,
        )
    try:
        body = RoutineCreate.model_validate(_fields(form))
        values = body.model_dump(mode="json")
        values["agent_id"] = body.agent_id
        row = await svc.routines.create(found[1].principal, values)
    except ValidationError as err:
        error = _validation_message(err)
        return await _routines(request, svc, found, status=422, error=error, form=kept, shown=shown)
    except BullpenError as err:
        await refused(request, err)
        return await _routines(
            request, svc, found, status=err.status, error=err.detail, form=kept, shown=shown
        )
    return RedirectResponse(f"/routines/{row.id}", status_code=303)


async def _routine(
    request: Request,
    svc: Services,
    found: Found,
    routine_id: UUID,
    *,
    status: int = 200,
    error: str | None = None,
    confirm: bool = False,
    form: dict[str, str] | None = None,
    shown: Preview | None = None,
) -> HTMLResponse:
    principal = found[1].principal
    try:
        routine: RoutineRecord = await svc.routines.get(principal, routine_id)
        fires = await svc.routines.fires(principal, routine_id, limit=FIRES_SHOWN, after=None)
        agents = await svc.agents.list(principal)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    upcoming = preview(svc, routine.cron, routine.timezone) if routine.enabled else None
    return await page(
        request,
        svc,
        found,
        "routine.html",
        section=SECTION,
        status=status,
        error=error,
        routine=routine,
        agent_name={a.id: a.name for a in agents}.get(routine.agent_id, "?"),
        fires=fires.rows,
        upcoming=upcoming,
        confirm=confirm,
        fires_shown=FIRES_SHOWN,
        form=form or _form_of(routine),
        edited=form is not None,
        agents=agents,
        preview=shown,
        preview_hint=f"Change the schedule to see its next {PREVIEW_SLOTS} fire times here "
        "before saving.",
        zones=zones(),
        preview_slots=PREVIEW_SLOTS,
        concurrency=[c.value for c in Concurrency],
        catch_up=[c.value for c in CatchUp],
    )


@router.get("/routines/{routine_id}", response_class=HTMLResponse, response_model=None)
async def routine_page(routine_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """One routine: its schedule, next fire times, fire history and actions."""
    found = await page_session(request, svc)
    return await _routine(request, svc, found, routine_id)


@router.post("/ui/routines/{routine_id}", response_model=None)
async def edit_routine(routine_id: UUID, request: Request, svc: ServicesDep) -> Response:
    """Change a routine (as the API's update: only what differs), or (the Preview button) show
    the next five fire times of the schedule typed first. Both need `agents:write`."""
    form = await _form(request)
    found = await form_session(request, svc, form.get("csrf", ""))
    principal = found[1].principal
    kept = {k: v for k, v in form.items() if k not in {"csrf", "action"}}
    shown = preview(svc, form.get("cron", ""), form.get("timezone", ""))
    try:
        need(principal, Permission.AGENTS_WRITE)  # the preview too: it is part of editing
        if form.get("action") == "preview":
            return await _routine(
                request,
                svc,
                found,
                routine_id,
                status=422 if shown.error else 200,
                form=kept,
                shown=shown,
            )
        routine = await svc.routines.get(principal, routine_id)
        changes = RoutineUpdate.model_validate(_changes(kept, routine))
        values = changes.model_dump(mode="json", exclude_unset=True)
        if "agent_id" in values:
            values["agent_id"] = changes.agent_id
        await svc.routines.update(principal, routine_id, values)
    except ValidationError as err:
        error = _validation_message(err)
        return await _routine(
            request, svc, found, routine_id, status=422, error=error, form=kept, shown=shown
        )
    except BullpenError as err:
        await refused(request, err)
        if err.status == 403:
            return await _routine(request, svc, found, routine_id, status=403, error=err.detail)
        return await _routine(
            request,
            svc,
            found,
            routine_id,
            status=err.status,
            error=err.detail,
            form=kept,
            shown=shown,
        )
    return RedirectResponse(f"/routines/{routine_id}", status_code=303)


@router.post("/ui/routines/{routine_id}/fire", response_model=None)
async def fire_routine(
    routine_id: UUID,
    request: Request,
    svc: ServicesDep,
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Queue the routine's task now, whatever its schedule (as the API's fire does)."""
    found = await form_session(request, svc, csrf)
    try:
        await svc.routines.fire(found[1].principal, routine_id)
    except BullpenError as err:
        await refused(request, err)
        return await _routine(request, svc, found, routine_id, status=err.status, error=err.detail)
    return RedirectResponse(f"/routines/{routine_id}", status_code=303)


@router.post("/ui/routines/{routine_id}/enabled", response_model=None)
async def set_enabled(
    routine_id: UUID,
    request: Request,
    svc: ServicesDep,
    enabled: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Pause (`no`) or resume (`yes`) a routine; resuming restarts its slots from now."""
    found = await form_session(request, svc, csrf)
    try:
        if enabled not in ("yes", "no"):
            raise InvalidInput("enabled: yes or no")
        changes: dict[str, Any] = {"enabled": enabled == "yes"}
        await svc.routines.update(found[1].principal, routine_id, changes)
    except BullpenError as err:
        await refused(request, err)
        return await _routine(request, svc, found, routine_id, status=err.status, error=err.detail)
    return RedirectResponse(f"/routines/{routine_id}", status_code=303)


@router.post("/ui/routines/{routine_id}/delete", response_model=None)
async def delete_routine(
    routine_id: UUID,
    request: Request,
    svc: ServicesDep,
    confirmed: Annotated[str, Form(max_length=10)] = "",
    csrf: Annotated[str, Form(max_length=128)] = "",
) -> Response:
    """Delete a routine and its fires (its tasks stay): the first post asks for confirmation."""
    found = await form_session(request, svc, csrf)
    if confirmed != "yes":
        return await _routine(request, svc, found, routine_id, confirm=True)
    try:
        await svc.routines.delete(found[1].principal, routine_id)
    except BullpenError as err:
        await refused(request, err)
        return await _routine(request, svc, found, routine_id, status=err.status, error=err.detail)
    return RedirectResponse("/routines", status_code=303)
