"""/api/v1/events: the workspace's task status changes and notices as one live stream (SSE)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from pydantic import StringConstraints
from pydantic.json_schema import SkipJsonSchema

from bullpen.api import docs
from bullpen.api.deps import ServicesDep, require
from bullpen.api.eventstream import EventStream
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.streams.changes import parse_cursor, workspace_stream

router = APIRouter(prefix="/api/v1/events", tags=["tasks"])
Reader = Annotated[Principal, require(Permission.TASKS_READ)]
CHANGE_ID = r"^([0-9]{1,19}-)?[0-9]{1,19}$"


@router.get(
    "",
    operation_id="streamWorkspaceEvents",
    responses={
        200: docs.EVENT_STREAM,
        **docs.problems(401, 403, 422, 429, 503),
    },
    response_class=EventStream,
    status_code=200,
    summary="Stream the workspace's task status changes and notices (SSE)",
)
async def workspace_events(
    principal: Reader,
    svc: ServicesDep,
    after: Annotated[
        Annotated[str, StringConstraints(pattern=CHANGE_ID)] | SkipJsonSchema[None],
        Query(
            description="Start after this event id, as `Last-Event-ID` does (which wins when "
            "both are given): for a client that cannot send headers, such as a browser's "
            "EventSource before it reconnects"
        ),
    ] = None,
    last_event_id: Annotated[
        Annotated[str, StringConstraints(pattern=CHANGE_ID)] | SkipJsonSchema[None],
        Header(
            description="Resume after this event id (the `id:` of an event of this stream); "
            "without it (or `after`) the stream starts from now"
        ),
    ] = None,
) -> EventStream:
    """A `task` event for every task created in the workspace and every change of a task's
    status (`task_id`, `number`, `parent_id`, `agent_id`, `status`, `previous`, `at`, and the
    `title` of a new task), and an event named for its kind for every workspace notice
    (`approval.requested`, `approval.decided`, `budget.warning`, `budget.exceeded`,
    `agent.paused`; its data has `kind`, `at` and the notice's fields), in the order they
    committed; replayed after `Last-Event-ID` for as long as changes are kept, then live. It
    does not end by itself."""
    feed, close = await svc.feeds.open(principal.workspace_id)
    start = last_event_id or after
    cursor = parse_cursor(start) if start else None
    return EventStream(
        workspace_stream(feed, cursor, svc.settings.sse_keepalive_s),
        on_close=close,
        write_timeout_s=svc.settings.sse_write_timeout_s,
    )
