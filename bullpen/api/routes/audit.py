"""/api/v1/audit-events: the workspace's append-only record of changes and refusals."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query

from bullpen.api import cursor, docs
from bullpen.api.deps import ServicesDep, instance_admin, require
from bullpen.api.instants import Instant, time_range
from bullpen.api.schemas.audit import AuditEventPublic, AuditPage
from bullpen.app import Services
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.store import audit

router = APIRouter(prefix="/api/v1/audit-events", tags=["audit"])

PageSize = Annotated[int, Query(ge=1, le=100, description="Page size (max 100)")]
Cursor = Annotated[
    str | None,
    Query(
        alias="cursor",
        max_length=200,
        description="`next_cursor` of the previous page (send the same filters with it)",
    ),
]
TargetId = Annotated[UUID | None, Query(description="Only events about this object")]
ActorId = Annotated[UUID | None, Query(description="Only events by this user or key")]
Since = Annotated[
    Instant | None,
    Query(description="Only events at or after this time (RFC 3339; without an offset, UTC)"),
]
Until = Annotated[
    Instant | None,
    Query(
        description="Only events before this time (RFC 3339; without an offset, UTC); "
        "before `since` is 422"
    ),
]


@router.get(
    "",
    operation_id="listAuditEvents",
    response_model=AuditPage,
    responses=docs.problems(*docs.READ),
    summary="List audit events",
)
async def list_audit_events(
    principal: Annotated[Principal, require(Permission.AUDIT_READ)],
    svc: ServicesDep,
    limit: PageSize = 50,
    cursor_: Cursor = None,
    action: Annotated[str | None, Query(max_length=64, description="e.g. `task.create`")] = None,
    target_id: TargetId = None,
    actor_id: ActorId = None,
    since: Since = None,
    until: Until = None,
) -> AuditPage:
    """Newest first, keyset-paginated; secrets never appear in `data`. `since` is inclusive,
    `until` exclusive."""
    return await _page(
        svc, principal.workspace_id, limit, cursor_, action, target_id, actor_id, since, until
    )


@router.get(
    "/instance",
    operation_id="listInstanceAuditEvents",
    response_model=AuditPage,
    responses=docs.problems(401, 403, 422, 429, 503),
    summary="List instance-level audit events (instance admins)",
)
async def list_instance_audit_events(
    principal: Annotated[Principal, instance_admin],
    svc: ServicesDep,
    limit: PageSize = 50,
    cursor_: Cursor = None,
    action: Annotated[str | None, Query(max_length=64, description="e.g. `user.create`")] = None,
    target_id: TargetId = None,
    actor_id: ActorId = None,
    since: Since = None,
    until: Until = None,
) -> AuditPage:
    """Instance admins' actions (users, workspaces created), in no workspace; newest first.
    `since` is inclusive, `until` exclusive."""
    return await _page(svc, None, limit, cursor_, action, target_id, actor_id, since, until)


async def _page(
    svc: Services,
    workspace_id: UUID | None,
    limit: int,
    cursor_: str | None,
    action: str | None,
    target_id: UUID | None,
    actor_id: UUID | None,
    since: datetime | None,
    until: datetime | None,
) -> AuditPage:
    """A page of the audit events of a workspace (None: of the instance)."""
    start, end = time_range(since, until)
    after = cursor.after(cursor_)
    async with svc.store.read() as conn:
        page = await audit.list_events(
            conn,
            workspace_id,
            limit=limit,
            after=after,
            action=action,
            target_id=target_id,
            actor_id=actor_id,
            since=start,
            until=end,
        )
    return AuditPage(
        items=[AuditEventPublic.from_row(row) for row in page.rows],
        next_cursor=cursor.next_of(page),
    )
