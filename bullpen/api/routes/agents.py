"""/api/v1/agents: create, list, read, change, pause and delete agents."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from bullpen.api import docs
from bullpen.api.deps import Agents, ServicesDep, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas.agents import (
    AgentCreate,
    AgentList,
    AgentPublic,
    AgentUpdate,
    OrgChart,
    org_chart,
)
from bullpen.domain.access import Permission
from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import Principal

router = APIRouter(prefix="/api/v1/agents", tags=["agents"])

AgentId = Annotated[UUID, docs.path_id("agent")]
Reader = Annotated[Principal, require(Permission.AGENTS_READ)]
Writer = Annotated[Principal, require(Permission.AGENTS_WRITE)]

_AGENT_LINKS = {
    "GetAgent": docs.link("getAgent", agent_id="$response.body#/id"),
    "UpdateAgent": docs.link("updateAgent", agent_id="$response.body#/id"),
}


@router.get(
    "",
    operation_id="listAgents",
    response_model=AgentList,
    responses=docs.problems(401, 403, 429, 503),
    summary="List agents",
)
async def list_agents(principal: Reader, agents: Agents) -> AgentList:
    """Every agent of the workspace, ordered by name."""
    rows = await agents.list(principal)
    return AgentList(
        items=[AgentPublic.from_row(row, principal, agents.limits(row)) for row in rows]
    )


async def _not_the_tree(request: Request) -> None:
    """`/agents/tree` is the org chart, read-only: other methods get 405, not an agent id's
    answer (the `{agent_id}` routes would otherwise take it)."""
    if request.path_params.get("agent_id") == "tree":
        raise StarletteHTTPException(405, headers={"Allow": "GET"})


@router.get(
    "/tree",
    operation_id="getOrgChart",
    response_model=OrgChart,
    responses=docs.problems(401, 403, 429, 503),
    summary="The org chart",
)
async def org_tree(principal: Reader, agents: Agents) -> OrgChart:
    """Every agent of the workspace nested under its manager, ready to draw."""
    return org_chart(await agents.list(principal))


@router.post(
    "",
    operation_id="createAgent",
    status_code=201,
    response_model=AgentPublic,
    dependencies=[Depends(require_json)],
    responses={
        **docs.created(AgentPublic, "The agent", _AGENT_LINKS),
        **docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    },
    summary="Create an agent",
)
async def create_agent(
    body: AgentCreate, principal: Writer, agents: Agents, idem: Idempotent
) -> Response:
    """Create an agent; its name must be unused in the workspace (409 otherwise)."""
    async with idem.begin(principal) as tx:
        row = await agents.create(
            principal,
            name=body.name,
            title=body.title,
            adapter=body.adapter.value,
            config=body.config,
            max_concurrent_runs=body.max_concurrent_runs,
            status=body.status.value,
            description=body.description,
            reports_to=body.reports_to,
            requires_approval=body.requires_approval,
            approval_ttl_s=body.approval_ttl_s,
            approval_default=None if body.approval_default is None else body.approval_default.value,
            breakers=None
            if body.breakers is None
            else body.breakers.model_dump(exclude_unset=True),
        )
        return tx.respond(
            201,
            AgentPublic.from_row(row, principal, agents.limits(row)),
            location=f"/api/v1/agents/{row.id}",
        )


@router.get(
    "/{agent_id}",
    operation_id="getAgent",
    response_model=AgentPublic,
    responses=docs.problems(*docs.READ),
    summary="Get an agent",
)
async def get_agent(agent_id: AgentId, principal: Reader, agents: Agents) -> AgentPublic:
    """One agent of the workspace."""
    row = await agents.get(principal, agent_id)
    return AgentPublic.from_row(row, principal, agents.limits(row))


@router.patch(
    "/{agent_id}",
    operation_id="updateAgent",
    response_model=AgentPublic,
    dependencies=[Depends(_not_the_tree), Depends(require_json)],
    responses=docs.problems(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    summary="Change, pause or resume an agent",
)
async def update_agent(
    agent_id: AgentId, body: AgentUpdate, principal: Writer, agents: Agents
) -> AgentPublic:
    """Only the fields sent change; `null` is not a value for any of them.

    `config` is replaced as a whole. `status` is `active` or `paused` (a paused agent takes no
    new tasks; its running ones finish). A name in use is 409.
    """
    changes = body.model_dump(exclude_unset=True)
    if "config" in changes:
        changes["config"] = body.config
    if "status" in changes:
        changes["status"] = body.status.value
    if changes.get("approval_default") is not None:
        changes["approval_default"] = str(changes["approval_default"])
    if "breakers" in changes:
        changes["breakers"] = body.breakers.model_dump(exclude_unset=True) if body.breakers else {}
    row = await agents.update(principal, agent_id, changes)
    return AgentPublic.from_row(row, principal, agents.limits(row))


@router.delete(
    "/{agent_id}",
    operation_id="deleteAgent",
    dependencies=[Depends(_not_the_tree)],
    status_code=204,
    response_class=Response,
    responses=docs.problems(401, 403, 404, 409, 422, 429, 503),
    summary="Delete an agent without tasks",
)
async def delete_agent(agent_id: AgentId, principal: Writer, agents: Agents) -> Response:
    """Delete an agent and its API keys; an agent with tasks is 409 (pause it instead)."""
    await agents.delete(principal, agent_id)
    return Response(status_code=204)


def _lifecycle(status: str, op: str, summary: str, doc: str) -> None:
    async def change(
        agent_id: AgentId, principal: Writer, agents: Agents, svc: ServicesDep
    ) -> AgentPublic:
        row = await agents.set_status(principal, agent_id, status)
        if status == AgentStatus.TERMINATED:
            await svc.tasks.cancel_open_of_agent(principal, agent_id)
        return AgentPublic.from_row(row, principal, agents.limits(row))

    change.__doc__ = doc
    router.add_api_route(
        f"/{{agent_id}}/{op}",
        change,
        methods=["POST"],
        operation_id=f"{op}Agent",
        response_model=AgentPublic,
        responses=docs.problems(401, 403, 404, 409, 422, 429, 503),
        summary=summary,
    )


_lifecycle(
    AgentStatus.PAUSED,
    "pause",
    "Pause an agent",
    "It claims no new runs; runs already running finish. Pausing a paused agent is a no-op.",
)
_lifecycle(
    AgentStatus.ACTIVE,
    "resume",
    "Resume a paused agent",
    "Its queued runs are claimed again; `paused_reason` is cleared and its breakers count "
    "afresh from now. A terminated agent cannot be resumed (409).",
)
_lifecycle(
    AgentStatus.TERMINATED,
    "terminate",
    "Terminate an agent",
    "For good: its tasks that have not ended are cancelled (running runs are stopped), its API "
    "keys are revoked, and new tasks for it are refused with 409 `agent-terminated`. It cannot "
    "be resumed.",
)
