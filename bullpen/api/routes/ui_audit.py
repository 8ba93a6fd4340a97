"""The dashboard's audit log: the workspace's audit events newest first, filtered by actor,
action, target and time range, in keyset pages; for the roles with `audit:read` (others get
the API's 403, audited, as the page's error).

It reads through the store query behind `GET /api/v1/audit-events`, with the same filters,
cursors and time range (parsed and checked by the same `bullpen.api.instants`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from bullpen.api import cursor, instants
from bullpen.api.deps import ServicesDep
from bullpen.api.routes.ui import Found, message, page, page_session, render
from bullpen.app import Services
from bullpen.domain.access import Permission, need
from bullpen.errors import BullpenError, InvalidInput
from bullpen.store import audit

router = APIRouter(include_in_schema=False)

SECTION = "audit"
PAGE_SIZE = 50
ACTION_MAX = 64  # the API's limit on `action`
MEMBERS_LISTED = 200  # members offered in the actor filter (any id can still be filtered on)
DATA_SHOWN = 2000  # characters of an event's data shown (the rest is in the API's answer)
# Pages that show an object of each audited target type.
LINKS = {"task": "/tasks/{}", "agent": "/agents/{}"}


def _uuid(value: str, field: str) -> UUID | None:
    if not value.strip():
        return None
    try:
        return UUID(value.strip())
    except ValueError:
        raise InvalidInput(f"{field}: not an id") from None


@dataclass(frozen=True, slots=True)
class Filters:
    """The log's filters from the query string; empty ones are no filter."""

    actor: str
    action: str
    target: str
    since: str
    until: str

    def parsed(self) -> dict[str, Any]:
        """The store query's filters; a malformed one is InvalidInput (422)."""
        if len(self.action) > ACTION_MAX:
            raise InvalidInput(f"action: at most {ACTION_MAX} characters")
        since, until = instants.time_range(
            instants.parse(self.since, "since"), instants.parse(self.until, "until")
        )
        return {
            "actor_id": _uuid(self.actor, "actor"),
            "action": self.action.strip() or None,
            "target_id": _uuid(self.target, "target"),
            "since": since,
            "until": until,
        }

    def query(self, **more: str) -> str:
        """The filters (and `more`) as a query string, empty values left out."""
        values = {
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "since": self.since,
            "until": self.until,
            **more,
        }
        return urlencode({k: v.strip() for k, v in values.items() if v.strip()})


@router.get("/audit", response_class=HTMLResponse, response_model=None)
async def audit_page(
    request: Request,
    svc: ServicesDep,
    actor: str = "",
    action: str = "",
    target: str = "",
    since: str = "",
    until: str = "",
) -> Response:
    """The audit log, newest first, filtered, in keyset pages."""
    found = await page_session(request, svc)
    filters = Filters(actor, action, target, since, until)
    page_cursor = request.query_params.get("cursor", "")
    principal = found[1].principal
    try:
        need(principal, Permission.AUDIT_READ)
    except BullpenError as err:
        return await message(request, svc, found, err, section=SECTION)
    actors = await _actors(svc, found)
    try:
        async with svc.store.read() as conn:
            listed = await audit.list_events(
                conn,
                principal.workspace_id,
                limit=PAGE_SIZE,
                after=cursor.after(page_cursor or None),
                **filters.parsed(),
            )
    except InvalidInput as err:
        return await _log(request, svc, found, filters, actors, status=err.status, error=err.detail)
    next_cursor = cursor.next_of(listed)
    return await _log(
        request,
        svc,
        found,
        filters,
        actors,
        events=listed.rows,
        next_url=f"/audit?{filters.query(cursor=next_cursor)}" if next_cursor else None,
        first_url=f"/audit?{filters.query()}" if page_cursor else None,
    )


async def _actors(svc: Services, found: Found) -> dict[str, str]:
    """Names of the users and API keys that may appear as actors, by id."""
    principal = found[1].principal
    names: dict[str, str] = {}
    try:
        members = await svc.workspaces.members(principal, limit=MEMBERS_LISTED, after=None)
        names.update({str(m.user_id): m.email for m in members.rows})
        keys = await svc.api_keys.list(principal)
        names.update({str(k.id): f"key {k.name} ({k.prefix}…)" for k in keys})
    except BullpenError:  # a role that reads the log but not members or keys: ids stand in
        pass
    return names


async def _log(
    request: Request,
    svc: Services,
    found: Found,
    filters: Filters,
    actors: dict[str, str],
    *,
    status: int = 200,
    error: str | None = None,
    events: list[Any] | None = None,
    next_url: str | None = None,
    first_url: str | None = None,
) -> HTMLResponse:
    context: dict[str, Any] = {
        "filters": filters,
        "actors": actors,
        "events": [_row(e, actors) for e in events or []],
        "next_url": next_url,
        "first_url": first_url,
        "action_max": ACTION_MAX,
        "error": error,
    }
    if request.headers.get("hx-request") == "true":
        return render(request, "audit_list.html", status=status, **context)
    return await page(request, svc, found, "audit.html", section=SECTION, status=status, **context)


def _row(event: Any, actors: dict[str, str]) -> dict[str, Any]:
    data = json.dumps(event.data, sort_keys=True, ensure_ascii=False, default=str)
    target = str(event.target_id) if event.target_id else ""
    link = LINKS.get(event.target_type)
    return {
        "id": event.id,
        "at": event.created_at.astimezone(UTC),
        "actor_type": event.actor_type,
        "actor_id": str(event.actor_id) if event.actor_id else "",
        "actor_name": actors.get(str(event.actor_id), "") if event.actor_id else "",
        "action": event.action,
        "target_type": event.target_type,
        "target_id": target,
        "target_href": link.format(target) if link and target else None,
        "data": data if len(data) <= DATA_SHOWN else data[:DATA_SHOWN] + "…",
    }
