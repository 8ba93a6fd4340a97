"""/api/v1/agents: create, list, read, change, pause and delete agents."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SecretStr,
    StringConstraints,
    TypeAdapter,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema
from starlette.exceptions import HTTPException as StarletteHTTPException

from bullpen.agents.configs import public_config
from bullpen.agents.http import SECRET_CHARS, HttpAgentConfig
from bullpen.agents.llm import LOOP_REPEATS, MAX_STEPS, MAX_WALL_S
from bullpen.agents.process import ProcessAgentConfig
from bullpen.api import docs
from bullpen.api.deps import Agents, ServicesDep, require, require_json
from bullpen.api.idempotency import Idempotent
from bullpen.api.schemas import Strict, integral, optional
from bullpen.domain.access import Permission
from bullpen.domain.agents import AgentStatus
from bullpen.domain.principal import Principal
from bullpen.domain.records import AgentRecord

SYSTEM_PROMPT_MAX = 20_000
DESCRIPTION_MAX = 20_000
MAX_TOKENS_MAX = 1_000_000
RUNS_MIN, RUNS_MAX = 1, 1000

# Printable, no control characters, no leading or trailing whitespace.
_WORD = r"^[^\x00-\x20\x7f]([^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"
# Multi-line text: tabs and line breaks allowed, other control characters not.
_PROSE = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"

AgentName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$"),
]
AgentTitle = Annotated[
    str, StringConstraints(max_length=200, strip_whitespace=True, pattern=r"^[^\x00-\x1f\x7f]*$")
]


Description = Annotated[str, StringConstraints(max_length=DESCRIPTION_MAX, pattern=_PROSE)]

# Constraints before the validator, so OpenAPI shows them as `minimum`/`maximum`.
MaxRuns = Annotated[int, Field(ge=RUNS_MIN, le=RUNS_MAX, strict=True), BeforeValidator(integral)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_MAX, strict=True), BeforeValidator(integral)]
MaxSteps = Annotated[int, Field(ge=1, le=1000, strict=True), BeforeValidator(integral)]
LoopRepeats = Annotated[int, Field(ge=2, le=1000, strict=True), BeforeValidator(integral)]


class Adapter(StrEnum):
    """How an agent runs: a model's tool loop, a webhook, or a local command."""

    LLM = "llm"
    HTTP = "http"
    PROCESS = "process"


class SettableStatus(StrEnum):
    """The statuses a caller may set (`terminated` is not one)."""

    ACTIVE = AgentStatus.ACTIVE.value
    PAUSED = AgentStatus.PAUSED.value


class LlmAgentConfig(Strict):
    """An `llm` agent's configuration: which model it calls, and how."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_WORD)] = Field(
        examples=["sim-1"],
        description="A model route of the workspace, `provider/model`, or a model that one "
        "provider offers; with `provider`, that provider's model name.",
    )
    provider: (
        Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_WORD)] | None
    ) = Field(
        default=None,
        examples=["simulated"],
        description="Call this provider directly (no fallback); omit to resolve `model`.",
    )
    system_prompt: (
        Annotated[str, StringConstraints(max_length=SYSTEM_PROMPT_MAX, pattern=_PROSE)] | None
    ) = Field(default=None, description="Omit for Bullpen's default system prompt.")
    max_tokens: MaxTokens | None = Field(
        default=None, description="Cap on each completion's output tokens; omit for none."
    )
    max_steps: MaxSteps | None = Field(
        default=None, description=f"Tool steps per run (default {MAX_STEPS}); beyond, it fails."
    )
    max_wall_s: Annotated[float, Field(gt=0, le=86_400, strict=True)] | None = Field(
        default=None, description=f"Wall time per run in seconds (default {MAX_WALL_S:g})."
    )
    max_cost_usd: Annotated[float, Field(gt=0, le=1_000_000, strict=True)] | None = Field(
        default=None, description="Provider cost per run in USD; no limit when omitted."
    )
    loop_repeats: LoopRepeats | None = Field(
        default=None,
        description=f"The same tool call (same arguments) made this often on a task is a "
        f"runaway loop and stops the run (default {LOOP_REPEATS}).",
    )


AgentConfig = LlmAgentConfig | HttpAgentConfig | ProcessAgentConfig
_CONFIG_OF: dict[Adapter, type[BaseModel]] = {
    Adapter.LLM: LlmAgentConfig,
    Adapter.HTTP: HttpAgentConfig,
    Adapter.PROCESS: ProcessAgentConfig,
}


def _config_for(value: Any, adapter: Adapter | None) -> BaseModel:
    """Validate a config as the given adapter's (or, not knowing it, the one its keys name),
    so errors point at `config.<field>`."""
    if adapter is None:
        keys = value.keys() if isinstance(value, dict) else ()
        adapter = (
            Adapter.HTTP if "url" in keys else Adapter.PROCESS if "command" in keys else Adapter.LLM
        )
    kind = _CONFIG_OF[adapter]
    return value if isinstance(value, kind) else kind.model_validate(value)


class _AgentFields(Strict):
    """What every new agent has, whatever its adapter."""

    name: AgentName = Field(description="Unique in the workspace.")
    title: AgentTitle = ""
    max_concurrent_runs: MaxRuns = Field(default=10, description="Runs of this agent at once.")
    status: SettableStatus = Field(
        default=SettableStatus.ACTIVE, description="A paused agent takes no new tasks."
    )
    description: Description = Field(
        default="", description="What the agent does; an `llm` agent gets it as instructions."
    )
    reports_to: UUID | None = Field(
        default=None,
        description="The agent's manager in the org chart (an agent of the workspace); the "
        "manager may delegate subtasks to it.",
    )


class LlmAgentCreate(_AgentFields):
    """A new `llm` agent: a tool loop over the gateway."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "analyst",
                    "title": "Data analyst",
                    "config": {"provider": "simulated", "model": "sim-1"},
                }
            ]
        },
    )

    adapter: Literal["llm"] = "llm"
    config: LlmAgentConfig


class NewHttpAgentConfig(HttpAgentConfig):
    """A new `http` agent's config: its `secret` is required."""

    secret: SecretStr = Field(
        min_length=SECRET_CHARS[0],
        max_length=SECRET_CHARS[1],
        description="The key of each request's HMAC-SHA256 signature (`Bullpen-Signature`); "
        "never shown again (the config shows `secret_hint`).",
    )


class HttpAgentCreate(_AgentFields):
    """A new `http` agent: a webhook Bullpen calls with each run."""

    adapter: Literal["http"]
    config: NewHttpAgentConfig


class ProcessAgentCreate(_AgentFields):
    """A new `process` agent: a command the operator allows, run on the worker's machine."""

    adapter: Literal["process"]
    config: ProcessAgentConfig


_CREATE_VARIANTS: TypeAdapter[Any] = TypeAdapter(
    LlmAgentCreate | HttpAgentCreate | ProcessAgentCreate
)


class AgentCreate(_AgentFields):
    """A new agent: `adapter` (default `llm`) and that adapter's `config`.

    Documented as one schema per adapter, as it is validated: a config of another adapter
    than the one named is refused at `config.<field>`.
    """

    adapter: Adapter = Adapter.LLM
    config: AgentConfig

    @field_validator("config", mode="wrap")
    @classmethod
    def _config_of_adapter(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        adapter = info.data.get("adapter")
        if adapter is Adapter.HTTP:  # a new webhook agent needs its secret
            return (
                value
                if isinstance(value, NewHttpAgentConfig)
                else (NewHttpAgentConfig.model_validate(value))
            )
        return _config_for(value, adapter)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(_CREATE_VARIANTS.core_schema)


class AgentUpdate(Strict):
    """Change an agent (send only what changes; `config` is replaced as a whole)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"status": "paused"}, {"title": "Lead analyst"}]},
    )

    name: AgentName = optional()
    title: AgentTitle = optional()
    config: AgentConfig = optional(
        "Replaces the whole config (of the agent's adapter; an `http` agent's secret is kept "
        "when left out, and a `process` agent's `secret_env` while its `command`, `cwd` and "
        "`env` stay the same)."
    )

    @field_validator("config", mode="wrap")
    @classmethod
    def _config_by_keys(cls, value: Any, handler: Any) -> Any:
        return _config_for(value, None)

    max_concurrent_runs: MaxRuns = optional()
    status: SettableStatus = optional("`active` or `paused`.")
    description: Description = optional()
    reports_to: UUID | None = Field(
        default=None, description="The new manager, or `null` for none (a root of the chart)."
    )


class AgentPublic(BaseModel):
    """An agent as the API shows it."""

    id: UUID
    name: str
    title: str
    adapter: str = Field(examples=["llm"])
    config: dict[str, Any] = Field(
        description="The adapter's config without its secrets: an `http` agent's shows "
        "`secret_hint`; a `process` agent's shows `secret_env_hints`, and `env` with its values "
        "only to callers with `agents:write` (others get `env_names` and `secret_env_names`)."
    )
    status: str = Field(examples=["active"], description="`active`, `paused` or `terminated`.")
    max_concurrent_runs: int
    description: str
    reports_to: UUID | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: AgentRecord, principal: Principal) -> AgentPublic:
        """Build from an `agents` row, as `principal` may see it."""
        return cls(
            id=row.id,
            name=row.name,
            title=row.title,
            adapter=row.adapter,
            config=public_config(
                row.adapter, row.config, values=principal.can(Permission.AGENTS_WRITE)
            ),
            status=row.status,
            max_concurrent_runs=row.max_concurrent_runs,
            description=row.description,
            reports_to=row.reports_to,
            created_at=row.created_at,
        )


class OrgNode(BaseModel):
    """An agent in the org chart, with the agents reporting to it."""

    id: UUID
    name: str
    title: str
    adapter: str
    status: str
    reports: list[OrgNode]


class OrgChart(BaseModel):
    """The workspace's org chart: the agents reporting to nobody, each with its reports,
    every level ordered by name."""

    roots: list[OrgNode]


def org_chart(rows: Sequence[Any]) -> OrgChart:
    """Nest the agents by `reports_to` (the service keeps the chart free of cycles)."""
    nodes = {
        row.id: OrgNode(
            id=row.id,
            name=row.name,
            title=row.title,
            adapter=row.adapter,
            status=row.status,
            reports=[],
        )
        for row in rows
    }
    roots: list[OrgNode] = []
    for row in rows:  # rows come ordered by name, so every level is
        manager = nodes.get(row.reports_to) if row.reports_to is not None else None
        (manager.reports if manager is not None else roots).append(nodes[row.id])
    return OrgChart(roots=roots)


class AgentList(BaseModel):
    """The workspace's agents by name."""

    items: list[AgentPublic]


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
    return AgentList(items=[AgentPublic.from_row(row, principal) for row in rows])


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
        if tx.replayed is not None:
            return tx.replayed
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
        )
        return tx.respond(
            201, AgentPublic.from_row(row, principal), location=f"/api/v1/agents/{row.id}"
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
    return AgentPublic.from_row(await agents.get(principal, agent_id), principal)


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
    return AgentPublic.from_row(await agents.update(principal, agent_id, changes), principal)


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
        return AgentPublic.from_row(row, principal)

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
    "Its queued runs are claimed again. A terminated agent cannot be resumed (409).",
)
_lifecycle(
    AgentStatus.TERMINATED,
    "terminate",
    "Terminate an agent",
    "For good: its tasks that have not ended are cancelled (running runs are stopped), its API "
    "keys are revoked, and new tasks for it are refused with 409 `agent-terminated`. It cannot "
    "be resumed.",
)
