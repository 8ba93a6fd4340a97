"""/api/v1/runs: one attempt of an agent on a task."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter

from bullpen.api import docs
from bullpen.api.deps import ServicesDep, require
from bullpen.api.schemas import RunPublic
from bullpen.domain.access import Permission
from bullpen.domain.principal import Principal
from bullpen.errors import NotFound
from bullpen.store import runs as run_store

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@router.get(
    "/{run_id}",
    operation_id="getRun",
    response_model=RunPublic,
    responses=docs.problems(*docs.READ),
    summary="Get a run",
)
async def get_run(
    run_id: Annotated[UUID, docs.path_id("run")],
    principal: Annotated[Principal, require(Permission.TASKS_READ)],
    svc: ServicesDep,
) -> RunPublic:
    """One run: status, attempt, timings, provider and model, usage, error."""
    async with svc.store.read() as conn:
        row = await run_store.get_run(conn, principal.workspace_id, run_id)
    if row is None:
        raise NotFound("no such run")
    return RunPublic.from_row(row)
