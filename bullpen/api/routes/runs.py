"""/api/v1/runs: one attempt of an agent on a task."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header
from pydantic import StringConstraints
from pydantic.json_schema import SkipJsonSchema

from bullpen.api import docs
from bullpen.api.deps import ServicesDep, require
from bullpen.api.eventstream import EventStream
from bullpen.api.schemas.tasks import RunPublic
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.domain.records import RunRecord
from bullpen.errors import NotFound
from bullpen.store import runs as run_store
from bullpen.streams.sse import run_stream

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])
RunId = Annotated[UUID, docs.path_id("run")]
Reader = Annotated[Principal, require(Permission.TASKS_READ)]


@router.get(
    "/{run_id}",
    operation_id="getRun",
    response_model=RunPublic,
    responses=docs.problems(*docs.READ),
    summary="Get a run",
)
async def get_run(run_id: RunId, principal: Reader, svc: ServicesDep) -> RunPublic:
    """One run: status, attempt, timings, provider and model, usage, error."""
    return RunPublic.from_row(await _run(svc, principal, run_id))


@router.get(
    "/{run_id}/events",
    operation_id="streamRunEvents",
    responses={
        200: docs.EVENT_STREAM,
        **docs.problems(*docs.READ, 503),
    },
    response_class=EventStream,
    status_code=200,
    summary="Stream a run's events (SSE)",
)
async def run_events(
    run_id: RunId,
    principal: Reader,
    svc: ServicesDep,
    last_event_id: Annotated[
        Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")] | SkipJsonSchema[None],
        Header(description="Resume after this event id (the run's `seq`; at most 9 digits)"),
    ] = None,
) -> EventStream:
    """The run's events replayed after `Last-Event-ID`, then live, until its `end` event."""
    row = await _run(svc, principal, run_id)
    live = svc.bus.open(row.task_id, principal.workspace_id)
    after = int(last_event_id) if last_event_id else 0
    return EventStream(
        run_stream(svc.store, live, run_id, after, svc.settings.sse_keepalive_s),
        on_close=live.close,
        write_timeout_s=svc.settings.sse_write_timeout_s,
    )


async def _run(svc: ServicesDep, principal: Principal, run_id: UUID) -> RunRecord:
    async with svc.store.read() as conn:
        row = await run_store.get_run(conn, principal.workspace_id, run_id)
    if row is None:
        raise NotFound("no such run")
    return row
